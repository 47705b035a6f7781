"""Where a run starts, on a real snapshot store, without Ray: a start that is not a resume
refuses a directory holding the flow's own committed snapshots (fresh=True discards them);
the sources are checked on the driver, on copies that keep no answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from driftstream.engine import Flow
from driftstream.engine.control.resume import check_sources, start_point
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import SnapshotPart, manifest_of
from driftstream.engine.model.plan import Instance
from driftstream.engine.model.recovery import RecoveryRules
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.snapshots.store import SnapshotStore

EO = dict(guarantee="exactly-once")


def _plan(source=None):
    flow = Flow("orders")
    flow.source(source or MemorySource(range(10), partitions=2), name="src").key_by(str).count(name="n").sink(MemorySink("o"))
    return flow.plan(2)


def _store_with_snapshot(path: Path, plan) -> SnapshotStore:
    store = SnapshotStore(str(path))
    parts = {Instance(0, i): SnapshotPart(sources={str(i): [i, i]}) for i in range(2)}
    store.write_manifest(4, manifest_of(plan, 4, (9,), parts, missing=[]).to_json())
    return store


def _start(plan, store, **options):
    config = RunConfig(**EO, **options)
    return start_point(plan, config, RecoveryRules(config, store.uri), store, next_id=5)


def test_a_start_without_resume_refuses_the_flows_own_snapshots_and_names_both_options(tmp_path):
    plan = _plan()
    store = _store_with_snapshot(tmp_path, plan)
    with pytest.raises(FlowError) as refused:
        _start(plan, store)
    message = str(refused.value)
    assert "flow 'orders' has snapshots in" in message and "(the newest: 4)" in message
    assert "resume=True (--resume) to continue from the newest snapshot" in message
    assert "fresh=True (--fresh) to discard the snapshots and start from the beginning" in message
    assert store.committed_ids() == [4]  # nothing discarded
    assert _start(plan, store, resume=True).manifest.snapshot_id == 4
    assert _start(plan, store, fresh=True).manifest is None
    assert store.snapshot_ids() == []  # fresh discarded them


def test_a_start_over_uncommitted_leftovers_only_goes_ahead_and_clears_them(tmp_path):
    plan = _plan()
    store = SnapshotStore(str(tmp_path))
    store.put_file(7, "orders-src-0", "part.json", b"{}")  # a snapshot that never got its manifest
    assert store.snapshot_ids() == [7] and store.committed_ids() == []
    assert _start(plan, store).manifest is None
    assert store.snapshot_ids() == []


def test_fresh_discards_even_manifests_that_cannot_be_read(tmp_path):
    plan = _plan()
    store = _store_with_snapshot(tmp_path, plan)
    manifest = Path(store._snapshot_dir(4)) / "MANIFEST.json"
    manifest.write_text(manifest.read_text().replace('"flow": "orders"', '"flow": "order"'))  # altered: fails its checksum
    with pytest.raises(OSError, match="no committed manifest can be used"):
        _start(plan, store)
    assert _start(plan, store, fresh=True).manifest is None
    assert store.snapshot_ids() == []


class _CountingSource(MemorySource):
    """Remembers its partition count once asked, as a KafkaSource does."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__(range(4), partitions=2)
        self.asked, self.fail = None, fail

    def partitions(self) -> int:
        if self.fail:
            raise FlowError("topic 'orders' does not exist at localhost:9092: create it first")
        self.asked = super().partitions()
        return self.asked


def test_sources_are_checked_on_copies_and_a_failure_names_the_source_step():
    source = _CountingSource()
    check_sources(_plan(source))
    assert source.asked is None  # the flow's own source keeps no answer: a later run asks again
    with pytest.raises(FlowError, match="topic 'orders' does not exist") as raised:
        check_sources(_plan(_CountingSource(fail=True)))
    assert raised.value.__notes__ == ["(source 'src' of flow 'orders', checked before the run started)"]
