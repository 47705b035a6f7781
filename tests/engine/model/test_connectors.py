"""The sink interface: t_last, and its old name last_bundle still honoured both ways."""

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
