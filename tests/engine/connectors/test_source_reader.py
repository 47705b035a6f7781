"""SourceReader's credit, pure logic: one instance reading several partitions always moves
on, whichever partition has data first (a Kafka partition's first fetch may come late)."""

from __future__ import annotations

from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.engine.model.connectors import Source, SourcePartition
from driftstream.engine.connectors.source_reader import SourceReader


class LatePartition(SourcePartition):
    """Records with timestamps ``stamps`` (non-decreasing); its first ``late`` reads find
    nothing ready yet."""

    def __init__(self, partition: int, stamps: list, late: int) -> None:
        self.partition, self.stamps, self.late, self.next = partition, stamps, late, 0
        self.done = not stamps

    def read(self, max_items: int) -> list:
        if self.late:
            self.late -= 1
            return []
        out = [((ts, 0, self.partition, o, (), False), o) for o, ts in enumerate(self.stamps[self.next:self.next + max_items], self.next)]
        self.next += len(out)
        self.done = self.next == len(self.stamps)
        return out

    def position(self) -> tuple:
        return self.next, None


class LateSource(Source):
    def __init__(self, parts: list) -> None:
        self.parts = parts

    def partitions(self) -> int:
        return len(self.parts)

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return LatePartition(partition, *self.parts[partition])


def read_through(source: Source, max_inflight: int, batch: int, steps: int = 5_000) -> list:
    """Poll as a source actor does, the watermark following the source's bound (no step
    holds anything back); every element read, or AssertionError if the reader stalls."""
    reader = SourceReader(source, source_id=0, instance=0, instances=1, max_inflight=max_inflight, batch_size=batch)
    got = []
    for _ in range(steps):
        if reader.done:
            return got
        if reader.has_credit():
            got += reader.poll(batch)
        reader.on_watermark(reader.bound())
    raise AssertionError(f"stalled after {len(got)} elements at bound {reader.bound()}")


def test_a_partition_whose_first_read_comes_late_still_gets_credit():
    """Partition 0's data is older but comes three reads late: partition 1 must leave it credit,
    and its newer times must not keep the credit of partition 0's older ones."""
    source = LateSource([(list(range(40)), 3), (list(range(100, 140)), 0)])
    got = read_through(source, max_inflight=8, batch=2)
    assert sorted(m[3] for m, _ in got if m[2] == 0) == list(range(40)) and len(got) == 80


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 50), max_size=30), st.integers(0, 5)), min_size=1, max_size=4), st.integers(1, 4))
def test_any_partitions_are_read_through(parts, batch):
    parts = [(sorted(stamps), late) for stamps, late in parts]
    got = read_through(LateSource(parts), max_inflight=1, batch=batch)  # the least credit the reader allows
    assert len(got) == sum(len(stamps) for stamps, _ in parts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=30), min_size=2, max_size=4), st.integers(1, 4), st.integers(1, 12))
def test_partitions_with_data_ready_are_emitted_in_t_order(stamps, batch, inflight):
    """Merged (the default), one instance's partitions leave in t order when each has data
    whenever read: a keyed step after it repairs nothing. Unmerged, they leave a read at a time."""
    parts = [(sorted(s), 0) for s in stamps]
    got = read_through(LateSource(parts), max_inflight=inflight, batch=batch)
    times = [m[:4] for m, _ in got]
    assert times == sorted(times) and len(got) == sum(len(s) for s in stamps)


def test_a_held_record_is_read_again_by_a_replay_and_holds_the_bound_below_it():
    """A record read but held for another partition's earlier ones is not emitted: the bound
    stays below it and a snapshot's position replays it."""
    reader = SourceReader(LateSource([(list(range(0, 40, 2)), 0), (list(range(1, 40, 2)), 0)]), source_id=0, instance=0,
                          instances=1, max_inflight=100, batch_size=4)
    first = reader.poll(4)
    assert [m[0] for m, _ in first] == [0, 1, 2, 3]  # partition 0 read 0, 2, 4, 6; partition 1 read 1, 3, 5, 7
    assert reader.bound() == (4, 0, 0, 1) and reader.lag() == 4  # just below partition 0's first held
    positions = reader.resume_positions(reader.bound())
    assert positions == {0: (2, 4), 1: (2, 5)}  # each replays from its first held record (offset 2)


def test_an_idle_partition_holds_nobody_back():
    """A partition whose read finds nothing (an idle Kafka partition) does not hold the others'
    records for the merge: latency at the live edge stays that of an unmerged reader."""
    reader = SourceReader(LateSource([(list(range(10)), 0), ([0], 100)]), source_id=0, instance=0, instances=1,
                          max_inflight=100, batch_size=4)
    assert [m[3] for m, _ in reader.poll(4)] == [0, 1, 2, 3]
    assert [m[3] for m, _ in reader.poll(4)] == [4, 5, 6, 7]
