"""Joins: lookup (stream-table) and window joins give the sequential reference's output (the
input in t order) for any arrival order, parallelism and crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource
from driftstream.engine.windows import Session, Sliding, Tumbling
from tests.reference import crashed_runs_differing, reference_outputs


def build(items: list, kind: str, how: str = "inner", window=None, partitions: int = 2, sink=None, name: str = "join",
          rate: float = 0.0, two_sources: bool = False) -> Flow:
    """Elements ``(side, key, value)``: side "L" goes left (the stream), "R" right (the table)."""
    flow = Flow(name)

    def source(part: list):
        return PacedSource(part, rate, partitions=partitions) if rate else MemorySource(part, partitions=partitions)

    if two_sources:
        left = flow.source(source([x for x in items if x[0] == "L"]), name="lefts")
        right = flow.source(source([x for x in items if x[0] == "R"]), name="rights")
    else:
        events = flow.source(source(items), name="events")
        left, right = events.filter(lambda x: x[0] == "L", name="is_left"), events.filter(lambda x: x[0] == "R", name="is_right")
    lk, rk = left.key_by(lambda x: x[1], name="left_key"), right.key_by(lambda x: x[1], name="right_key")
    if kind == "lookup":
        out = lk.lookup(rk)
    elif kind == "interval":
        out = lk.join(rk, interval=window, how=how)
    else:
        out = lk.join(rk, window=window, how=how)
    out.sink(sink or MemorySink("out"))
    return flow


items = st.lists(st.tuples(st.sampled_from("LR"), st.sampled_from("ab"), st.integers(0, 9)), max_size=50)


@settings(max_examples=150, deadline=None)
@given(data=items, kind=st.sampled_from(["lookup", "inner", "left", "outer"]),
       window=st.sampled_from([Tumbling(0.004), Tumbling(0.01), Sliding(0.01, 0.004)]), two_sources=st.booleans(),
       parallelism=st.integers(1, 4), partitions=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_any_arrival_order_gives_the_sequential_join(data, kind, window, two_sources, parallelism, partitions, seed):
    flow = build(data, "lookup" if kind == "lookup" else "join", kind, window, partitions, two_sources=two_sources)
    assert flow.run(runtime="simulator", parallelism=parallelism, seed=seed).output("out") == reference_outputs(flow)["out"]


@settings(max_examples=150, deadline=None)
@given(data=items, how=st.sampled_from(["inner", "left", "outer"]), interval=st.sampled_from([(0, 0.003), (-0.002, 0.002), (-0.005, -0.001)]),
       two_sources=st.booleans(), parallelism=st.integers(1, 4), partitions=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_any_arrival_order_gives_the_sequential_interval_join(data, how, interval, two_sources, parallelism, partitions, seed):
    flow = build(data, "interval", how, interval, partitions, two_sources=two_sources)
    assert flow.run(runtime="simulator", parallelism=parallelism, seed=seed).output("out") == reference_outputs(flow)["out"]


def test_an_interval_join_pairs_within_the_interval_and_pads_the_unmatched():
    # one element per ms of source time; interval (0, 2 ms): a right 0-2 ms after its left
    data = [("L", "k", 1), ("R", "k", "x"), ("R", "k", "y"), ("R", "k", "z"), ("L", "k", 2), ("R", "j", "w"), *[("L", "n", 0)] * 5]
    got = lambda how: [(k, l and l[2], r and r[2]) for k, l, r in  # noqa: E731
                       build(data, "interval", how, (0, 0.002), partitions=1).run(runtime="simulator", parallelism=2, seed=1).output("out")]
    inner = [("k", 1, "x"), ("k", 1, "y")]  # z came 3 ms after; ("k", 2) has no right within 2 ms
    assert got("inner") == inner
    assert sorted(got("left"), key=str) == sorted(inner + [("k", 2, None)] + [("n", 0, None)] * 5, key=str)
    assert sorted(got("outer"), key=str) == sorted(got("left") + [("k", None, "z"), ("j", None, "w")], key=str)


def test_lookup_takes_the_table_value_at_the_element_position_in_t():
    data = [("L", "a", 1), ("R", "a", "first"), ("L", "a", 2), ("R", "b", "other"), ("R", "a", "second"), ("L", "a", 3), ("L", "b", 4)]
    for seed in range(20):  # late updates re-apply the lookups after them
        out = build(data, "lookup").run(runtime="simulator", parallelism=2, seed=seed).output("out")
        assert [(x[2], v and v[2]) for x, v in out] == [(1, None), (2, "first"), (3, "second"), (4, "other")]


def test_window_join_pairs_each_left_with_each_right_of_its_window():
    # one element per ms of source time: window [0, 5 ms) holds the first five, [5, 10) the rest
    data = [("L", "k", 1), ("R", "k", "x"), ("L", "k", 2), ("R", "j", "y"), ("L", "j", 3),
            ("L", "k", 4), ("R", "i", "z"), ("L", "m", 5), ("R", "k", "w"), ("L", "k", 6)]
    pairs = lambda how: [(k, l and l[2], r and r[2]) for k, l, r in  # noqa: E731
                         build(data, "join", how, Tumbling(0.005), partitions=1).run(runtime="simulator", seed=3).output("out")]
    assert sorted(pairs("inner")) == [("j", 3, "y"), ("k", 1, "x"), ("k", 2, "x"), ("k", 4, "w"), ("k", 6, "w")]
    assert sorted(pairs("left"), key=str) == sorted(pairs("inner") + [("m", 5, None)], key=str)
    assert sorted(pairs("outer"), key=str) == sorted(pairs("left") + [("i", None, "z")], key=str)


@pytest.mark.parametrize("kind", ["lookup", "outer", "interval"])
def test_joins_survive_simulated_crashes(kind):
    data = [("LR"[(i * 7) % 3 == 0], "abc"[i % 3], i) for i in range(60)]
    if kind == "interval":
        flow = build(data, "interval", "outer", (-0.004, 0.003), partitions=3)
    else:
        flow = build(data, "lookup" if kind == "lookup" else "join", kind, Sliding(0.01, 0.005), partitions=3)
    # At least 40 seeds (at 40: 14 to 37 restores of a committed snapshot, per kind), then on
    # (up to 100) only until the restores asserted below have happened.
    wrong, restored = crashed_runs_differing(flow, {"out": reference_outputs(flow)["out"]}, 100,
                                             enough=lambda seeds, restored: seeds >= 40 and restored > 12)
    assert not wrong, wrong[:5]
    assert restored > 12  # recoveries from a committed snapshot, with joins' state in it


def test_invalid_joins_fail_when_built():
    flow = Flow("bad")
    a = flow.source(MemorySource([1])).key_by(lambda x: x)
    b = flow.source(MemorySource([2])).key_by(lambda x: x)
    with pytest.raises(FlowError, match="how="):
        a.join(b, window=Tumbling(1), how="full")
    with pytest.raises(FlowError, match="window="):
        a.join(b, window=Session(1))
    with pytest.raises(FlowError, match="itself"):
        a.lookup(a)
    with pytest.raises(FlowError, match="keyed stream"):
        a.lookup(flow.source(MemorySource([3])))


@pytest.mark.parametrize("kind", ["lookup", "left", "interval"])
def test_joins_on_ray_exactly_once_with_a_kill(ray_session, tmp_path, kind):
    data = [("LR"[(i * 7) % 3 == 0], "abcd"[i % 4], i) for i in range(2000)]
    how, window = ("outer", (-0.01, 0.005)) if kind == "interval" else (kind, Tumbling(0.05))
    op = {"lookup": "lookup", "left": "join", "interval": "interval"}[kind]
    reference = reference_outputs(build(data, op, how, window))["out"]
    flow = build(data, op, how, window, name="join-ray", rate=1500, sink=FileSink(tmp_path / "out", name="out"))
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                      faults={"before_commit": ["join-ray/left_key/1"]})
    assert result.metrics.recoveries >= 1
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == json.loads(json.dumps(reference))
