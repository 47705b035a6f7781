"""A manifest's run counts: the restored manifest's totals plus its parts', kept in its
JSON, and absent (None) in a manifest written before they were kept."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.model.manifest import Instance, Manifest, SnapshotPart, manifest_of
from driftstream.engine.model.run_counts import RunCounts
from driftstream.engine.testing import MemorySink, MemorySource


def _plan():
    flow = Flow("counts")
    flow.source(MemorySource([1]), name="src").key_by(str, name="k").count(name="n").sink(MemorySink("out"))
    return flow.plan(1)


def test_a_manifest_adds_its_parts_counts_to_the_restored_ones_and_keeps_them_in_its_json():
    plan = _plan()
    parts = {Instance(0, 0): SnapshotPart(sources={"0": [3, 3]}, counts=RunCounts()),
             Instance(1, 0): SnapshotPart(counts=RunCounts({"out": 4}, {"k": 1}))}  # a part with nothing to store
    first = manifest_of(plan, 1, (3,), parts, missing=[])
    assert first.counts == RunCounts({"out": 4}, {"k": 1}) and list(first.parts) == ["0/0"]
    second = manifest_of(plan, 2, (5,), {Instance(1, 0): SnapshotPart(counts=RunCounts({"out": 2}))}, [], restored=first)
    assert second.counts == RunCounts({"out": 6}, {"k": 1})
    assert Manifest.from_json(second.to_json()) == second


def test_a_manifest_without_counts_reads_as_none_and_one_uncounted_part_makes_none():
    plan = _plan()
    old = manifest_of(plan, 1, (3,), {Instance(0, 0): SnapshotPart(sources={"0": [3, 3]})}, [])
    data = old.to_json()
    assert old.counts is None and "counts" not in data and Manifest.from_json(data).counts is None
    # restored from it, the counts start there (zero)
    after = manifest_of(plan, 2, (5,), {Instance(1, 0): SnapshotPart(counts=RunCounts({"out": 2}))}, [], restored=old)
    assert after.counts == RunCounts({"out": 2})
