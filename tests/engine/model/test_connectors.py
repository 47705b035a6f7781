"""The connector interfaces (engine/model/connectors.py): t_last and its old name last_bundle
honoured both ways; one set, exported from ``driftstream.engine``; the pure core below them."""

from __future__ import annotations

from driftstream.engine.model.connectors import SinkPartition
from driftstream.ordering.meta import Meta

T = Meta(3, 0, 0, 3)


class _New(SinkPartition):
    def write(self, bundle) -> None:
        pass

    def t_last(self):
        return T


class _Old(SinkPartition):
    def write(self, bundle) -> None:
        pass

    def last_bundle(self):
        return T


class _Neither(SinkPartition):
    def write(self, bundle) -> None:
        pass


def test_a_sink_written_against_either_name_answers_both():
    assert _New().t_last() == _New().last_bundle() == T
    assert _Old().t_last() == _Old().last_bundle() == T
    assert _Neither().t_last() is None and _Neither().last_bundle() is None


def test_the_connector_interfaces_are_one_set_exported_from_the_engine():
    import driftstream.engine as engine
    from driftstream.engine.model import connectors

    assert (engine.Sink, engine.SinkPartition, engine.Source, engine.SourcePartition) == (
        connectors.Sink, connectors.SinkPartition, connectors.Source, connectors.SourcePartition)
    assert engine.FileSink.__module__ == "driftstream.engine.connectors.file_sink"  # beside every other connector


def test_the_pure_core_imports_nothing_of_the_engine():
    """The interfaces are in engine/model/ and not in barriers/ so that the pure core stays
    below the engine (DESIGN.md: engine -> barriers -> ordering)."""
    import ast
    from pathlib import Path

    import driftstream.barriers
    import driftstream.ordering
    import driftstream.snapshots

    wrong = []
    for package in (driftstream.barriers, driftstream.ordering, driftstream.snapshots):
        for path in Path(package.__file__).parent.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                wrong += [f"{path}: {n}" for n in names if n.startswith("driftstream.engine")]
    assert not wrong, wrong
