"""KeyedStream.fold / reduce / count: one (key, aggregate) per element, the aggregate of the
key's elements in t order, whatever the arrival order, parallelism and failures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.steps import STATEFUL_MAP
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource
from tests.reference import reference_outputs


def _flow(items: list, partitions: int, kind: str, sink=None, name: str = "", rate: float = 0.0) -> Flow:
    flow = Flow(name or f"agg-{kind}")
    source = PacedSource(items, rate, partitions=partitions) if rate else MemorySource(items, partitions=partitions)
    keyed = flow.source(source).key_by(lambda kv: kv[0])
    if kind == "fold":  # order-sensitive: the aggregate is the key's values in t order
        out = keyed.fold("", lambda acc, kv: acc + kv[1])
    elif kind == "reduce":
        out = keyed.map(lambda kv: kv[1]).key_by(lambda v: v[:1]).reduce(lambda a, b: a + b)
    else:
        out = keyed.count()
    out.sink(sink or MemorySink("out"))
    return flow


items = st.lists(st.tuples(st.sampled_from("abc"), st.text("xyz", min_size=1, max_size=3)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(data=items, kind=st.sampled_from(["fold", "reduce", "count"]), parallelism=st.integers(1, 4),
       partitions=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_any_arrival_order_gives_the_sequential_aggregates(data, kind, parallelism, partitions, seed):
    flow = _flow(data, partitions, kind)
    expected = reference_outputs(flow)["out"]
    assert flow.run(runtime="simulator", parallelism=parallelism, seed=seed).output("out") == expected


def test_the_aggregates_of_a_small_input():
    data = [("a", "x"), ("b", "y"), ("a", "z"), ("a", "x")]
    assert _flow(data, 2, "fold").run(runtime="simulator", seed=1).output("out") == [("a", "x"), ("b", "y"), ("a", "xz"), ("a", "xzx")]
    assert _flow(data, 2, "count").run(runtime="simulator", seed=1).output("out") == [("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    assert _flow(data, 1, "reduce").run(runtime="simulator", seed=1).output("out") == [("x", "x"), ("y", "y"), ("z", "z"), ("x", "xx")]


def test_an_aggregate_may_be_none_and_names_default_to_the_operator():
    flow = Flow("none")
    keyed = flow.source(MemorySource([1, 2, 3])).key_by(lambda x: 0)
    keyed.fold(None, lambda acc, x: None if acc else x).sink(MemorySink("a"))  # None, then restarts
    keyed.count().sink(MemorySink("b"))
    keyed.count().sink(MemorySink("c"))
    assert [s.name for s in flow.steps if s.kind is STATEFUL_MAP] == ["fold", "count", "count_1"]
    result = flow.run(runtime="simulator", seed=2)
    assert result.output("a") == [(0, 1), (0, None), (0, 3)]
    assert result.output("c") == [(0, 1), (0, 2), (0, 3)]


def test_an_aggregate_needs_a_keyed_stream():
    flow = Flow("unkeyed")
    with pytest.raises(FlowError, match=r"count needs a keyed stream; call .key_by\(key_fn\) right before .count"):
        flow.source(MemorySource([1])).count()


def test_aggregates_on_ray_with_exactly_once_and_a_kill(ray_session, tmp_path):
    data = [(k, v) for k, v in zip("abcab" * 300, "xyzzy" * 300)]
    expected = reference_outputs(_flow(data, 2, "fold"))["out"]
    flow = _flow(data, 2, "fold", sink=FileSink(tmp_path / "out", name="out"), name="agg-ray", rate=1000)
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                      faults={"before_commit": ["agg-ray/key_by/1"]})
    assert result.metrics.recoveries >= 1
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == [list(p) for p in expected]  # JSON: lists
