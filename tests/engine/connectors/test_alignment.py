"""Aligned sources, pure logic: instances told the frontier (the least bound over all of
them) never emit past it by more than the slack, never stall, emit every element once,
and a replay from their positions gives the same elements with the same times."""

from __future__ import annotations

from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.engine.connectors.alignment import ALIGNMENT_RUN
from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.testing import MemorySource

from tests.engine.connectors.test_source_reader import LateSource


def drive(readers: list, rounds: int = 20_000, took: Optional[list] = None) -> list:
    """Poll every instance in turn, telling all of them the frontier after each poll, the
    watermark following it; returns what each emitted, or AssertionError on a stall.
    ``took``: gets the number of rounds (round trips to the acker) appended."""
    emitted: list = [[] for _ in readers]
    for n in range(rounds):
        if all(r.done for r in readers):
            if took is not None:
                took.append(n)
            return emitted
        for i, r in enumerate(readers):
            if not r.done and r.has_credit():
                for part in r.parts:
                    _check_each_read(part)
                emitted[i] += r.poll(8)
        frontier = min(r.bound() for r in readers)
        for r in readers:
            r.align(frontier)
            r.on_watermark(frontier)
    raise AssertionError(f"stalled at frontier {min(r.bound() for r in readers)}")


def _check_each_read(part) -> None:
    """Make every read of ``part`` (a HeldPartition) assert that it hands out nothing past the
    limit that read applied: the slack, or the run at the spacing measured so far. Checked
    after the whole poll instead, a later read of the same poll may have lowered the spacing
    (a moving average) below what let an element out."""
    if getattr(part, "_checked", False):
        return
    read = part.read

    def read_within_the_limit(max_items: int) -> list:
        out = read(max_items)
        limit = part.alignment.limit(part.spacing)  # as the read measured it
        assert all(meta[0] <= limit for meta, _ in out), (out, limit)  # never past the slack (or its run)
        return out

    part.read, part._checked = read_within_the_limit, True


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.tuples(st.lists(st.integers(0, 50), max_size=40).map(sorted), st.integers(0, 3)), min_size=1, max_size=4),
       instances=st.integers(1, 3), slack=st.sampled_from([0, 1, 5, 30]))
def test_aligned_instances_emit_everything_once_within_the_slack(parts, instances, slack):
    source = LateSource(parts)
    readers = [SourceReader(source, 0, i, instances, max_inflight=16, batch_size=8, alignment_slack=slack) for i in range(instances)]
    emitted = drive(readers)
    got = sorted(meta[:4] for e in emitted for meta, _ in e)
    assert got == sorted((ts, 0, p, o) for p, (stamps, _) in enumerate(parts) for o, ts in enumerate(stamps))


def test_instances_stay_aligned_where_unaligned_ones_drift_apart():
    """Two instances over one list (one partition each), one polled four times as often:
    aligned, the faster never gets more than the slack ahead of the other."""
    items = list(range(400))

    def spread(slack):
        readers = [SourceReader(MemorySource(items, partitions=2), 0, i, 2, max_inflight=400, batch_size=8, alignment_slack=slack)
                   for i in range(2)]
        worst = 0
        for step in range(2_000):
            for i, r in enumerate(readers):
                if not r.done and (i == 0 or step % 4 == 0):
                    r.poll(8)
            frontier = min(r.bound() for r in readers)
            for r in readers:
                r.align(frontier)
            if not any(r.done for r in readers):
                worst = max(worst, abs(readers[0].bound()[0] - readers[1].bound()[0]))
        assert all(r.done for r in readers)
        return worst

    assert spread(10_000) > 100  # a slack past the whole list: unaligned, it drifts by hundreds
    # aligned: the slack, stretched to ALIGNMENT_RUN of a partition's records (2 units apart:
    # the other partition has every other element), and at most one read of 8 of its own
    assert spread(10) <= max(10, 2 * ALIGNMENT_RUN) + 16


def test_a_sparse_backlog_reads_a_run_of_records_per_round_trip_not_one():
    """Records 100 ms apart, two partitions interleaved, a slack of 2 ms: each round trip to the
    acker (a frontier told) lets a partition read up to ALIGNMENT_RUN of its records, not one;
    without the run it took a round per record."""
    stamps = [list(range(p * 50, 400 * 100, 100)) for p in range(2)]
    took: list = []
    source = LateSource([(stamps[0], 0), (stamps[1], 0)])
    readers = [SourceReader(source, 0, i, 2, max_inflight=400, batch_size=8, alignment_slack=2) for i in range(2)]
    emitted = drive(readers, took=took)
    assert sum(map(len, emitted)) == 800
    assert took[0] <= 800 / 8  # a read of 8 per round: a round trip no longer waits for each record


def test_positions_point_at_the_first_element_held_back():
    reader = SourceReader(MemorySource(list("abcdefgh"), partitions=1), 0, 0, 1, max_inflight=100, batch_size=8, alignment_slack=2)
    reader.align((1, 0, 0, 1))
    assert [p for _, p in reader.poll(8)] == ["a", "b", "c", "d"]  # ts 0..3: up to 1 + 2
    assert reader.waiting() and reader.resume_positions((9,)) == {0: (4, 4)}
    replay = SourceReader(MemorySource(list("abcdefgh"), partitions=1), 0, 0, 1, max_inflight=100, starts={0: (4, 4)})
    assert [(m[0], p) for m, p in replay.poll(8)] == [(4, "e"), (5, "f"), (6, "g"), (7, "h")]


def test_each_source_aligns_to_its_own_frontier():
    """Two sources on clocks a billion units apart, merged: aligned (slack 2), each source's
    partitions align among themselves; to one frontier over both, the later clock's source
    could not emit until the other had finished. The simulator's output is everything once,
    and the frontier told to each instance is its own source's."""
    from driftstream.engine import Flow
    from driftstream.engine.model.config import RunConfig
    from driftstream.engine.runtime.simulator import Simulation
    from driftstream.engine.testing import MemorySink

    early = MemorySource(list(range(300)), partitions=2)
    late = MemorySource(list(range(300)), partitions=2, timestamp=lambda x: 1e9 + x)
    flow = Flow("two-clocks")
    a = flow.source(early, name="early")
    b = flow.source(late, name="late")
    sink = MemorySink("out")
    a.merge(b).key_by(lambda x: x % 7).stateful_map(lambda s, x: ((s or 0) + 1, x), name="count").sink(sink)
    plan = flow.plan(2)
    assert plan.source_groups == [(0, 1), (0, 1), (2, 3), (2, 3)]
    sim = Simulation(plan, RunConfig(seed=3, source_alignment=2))
    told: dict = {}
    send = sim._send_control

    def record(sender, receiver, message):
        if type(message).__name__ == "Align" and message.frontier[0] != float("inf"):
            told.setdefault(plan.stages[receiver.stage].name, []).append(message.frontier[0])
        send(sender, receiver, message)

    sim._send_control = record
    result = sim.run()
    assert sorted(result.output("out")) == sorted(list(range(300)) * 2)
    assert told["early"] and max(told["early"]) < 1e9  # while the late clock's source read at 1e9 and up
    assert told["late"] and min(told["late"]) >= 1e9


def test_a_partition_that_has_read_all_its_source_holds_is_not_held():
    """At the live edge (lag 0) a partition emits what it reads at once, however far past the
    frontier; behind (lag > 0, or unknown), the same read waits for the frontier."""
    from driftstream.engine.connectors.alignment import Alignment, HeldPartition

    class Caught:
        def __init__(self, lag):
            self.part, self.lag_value = MemorySource(list("abcdef")).open(0, 0), lag

        def __getattr__(self, name):
            return getattr(self.part, name)

        def lag(self):
            return self.lag_value

    for lag, emitted in ((0, 6), (3, 0), (None, 0)):
        part = HeldPartition(Caught(lag), Alignment(slack=1))  # frontier unknown: the limit is -inf
        assert len(part.read(10)) == emitted


def test_auto_aligns_the_sources_of_a_flow_with_keyed_state_only():
    """Under "auto" a flow without keyed state reads its sources unaligned (nothing would be
    repaired: the hold only costs rate); one with keyed state aligns; a number aligns both."""
    from driftstream.engine import Flow
    from driftstream.engine.model.config import RunConfig
    from driftstream.engine.runtime.simulator import Simulation
    from driftstream.engine.testing import MemorySink

    class Slack(MemorySource):
        alignment_slack = 2.0

    def plan(stateful: bool):
        flow = Flow("aligned" if stateful else "stateless")
        events = flow.source(Slack(list(range(40)), partitions=2, timestamp=float), name="events")
        if stateful:
            events = events.key_by(lambda x: x % 3).stateful_map(lambda s, x: ((s or 0) + x, x), name="sum")
        events.map(lambda x: x, name="same").sink(MemorySink("out"))
        return flow.plan(2)

    for stateful, configured, aligned in ((False, "auto", False), (True, "auto", True), (False, 2.0, True)):
        sim = Simulation(plan(stateful), RunConfig(seed=1, source_alignment=configured))
        assert (sim.aligned is not None) == aligned
        result = sim.run()
        assert sorted(result.output("out")) == list(range(40))
        assert all((r.alignment is not None) == aligned for r in sim.readers.values())


def test_a_run_is_128_elements_worth_of_records_and_a_sparse_source_reads_up_to_1024_a_round_trip():
    """The run follows what a record makes downstream: a record into one element reads ~128 a
    round trip to the acker, one into ~50 the least (16), and one into ~0.08 (Nexmark q8's
    events, of which only people and auctions go on) 1,024, not 128: capped at 128 records,
    q8's sources sent 2-10 elements a round trip (issue 57)."""
    from driftstream.engine.connectors.alignment import ALIGNMENT_MAX_RUN, Alignment

    runs = {}
    for name, records, elements in (("bids", 1000, 920), ("documents", 100, 5000), ("people and auctions", 1000, 80)):
        align = Alignment(slack=0.0)
        align.made(records, elements)
        align.frontier = (1000, 0, 0, 0)
        runs[name] = (align.run, align.limit(spacing=1.0))
    assert runs == {"bids": (139, 1139.0), "documents": (ALIGNMENT_RUN, 1000.0 + ALIGNMENT_RUN), "people and auctions": (1024, 2024.0)}
    assert ALIGNMENT_MAX_RUN == 1024
