"""Windowed aggregations: the output is the sequential reference's (the input in t order)
for any arrival order, parallelism and crash, late elements included and accounted for."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.barriers.json_payloads import json_default
from driftstream.engine import Flow
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource
from driftstream.engine.windows import Late, Session, Sliding, Tumbling
from tests.reference import crashed_runs_differing, reference_outputs


def _event_s(x) -> float:
    return x[1] / 1000


def build(items: list, assigner, aggregate: str, lateness: float = 0.0, partitions: int = 2, sink=None,
          late_sink=None, name: str = "win", rate: float = 0.0, source_time: bool = False) -> Flow:
    """Elements ``(key, event ms, value)``; a MemorySource's source time is the element's index
    (ms), so an element whose event time lags its index by more than a window is late.
    ``source_time``: the source time is the running max of the event times per partition (a
    Kafka partition's record timestamps), and the windows use it."""
    flow = Flow(name)
    ts = _event_s if source_time else None
    source = PacedSource(items, rate, partitions=partitions, timestamp=ts) if rate else MemorySource(items, partitions=partitions, timestamp=ts)
    windowed = flow.source(source).key_by(lambda x: x[0]).window(assigner, timestamp=None if source_time else _event_s, allowed_lateness=lateness)
    if aggregate == "count":
        out = windowed.count()
    elif aggregate == "collect":
        out = windowed.collect()
    elif aggregate == "fold":  # order-sensitive: the values in t order
        out = windowed.fold("", lambda acc, x: acc + x[2])
    else:
        out = windowed.reduce(lambda a, b: (a[0], max(a[1], b[1]), a[2] + b[2]))
    out.late(late_sink or MemorySink("late")).sink(sink or MemorySink("out"))
    return flow


elements = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60), st.sampled_from("xyz")), max_size=50)
assigners = st.one_of(st.builds(Tumbling, st.sampled_from([0.004, 0.01, 0.025])),
                      st.builds(Sliding, st.sampled_from([0.01, 0.02]), st.sampled_from([0.003, 0.005, 0.01])),
                      st.builds(Session, st.sampled_from([0.002, 0.005, 0.012])))


@settings(max_examples=150, deadline=None)
@given(data=elements, assigner=assigners, aggregate=st.sampled_from(["count", "collect", "fold", "reduce"]),
       lateness=st.sampled_from([0.0, 0.005]), parallelism=st.integers(1, 4), partitions=st.integers(1, 3), seed=st.integers(0, 2**32),
       source_time=st.booleans())
def test_any_arrival_order_gives_the_sequential_windows(data, assigner, aggregate, lateness, parallelism, partitions, seed, source_time):
    flow = build(data, assigner, aggregate, lateness, partitions, source_time=source_time)
    expected = reference_outputs(flow)
    result = flow.run(runtime="simulator", parallelism=parallelism, seed=seed)
    assert result.output("out") == expected["out"]
    assert result.output("late") == expected["late"]
    assert result.metrics.late_elements == {"window": len(expected["late"])}


def test_windows_close_late_elements_are_accounted_for_and_empty_windows_emit_nothing():
    # (key, event ms, value), one element per ms of source time
    data = [("a", 0, "x"), ("a", 3, "y"), ("b", 2, "z"), ("a", 12, "x"), ("a", 4, "w"), ("a", 5, "v"),
            ("b", 1, "u"), ("a", 30, "x"), ("c", 25, "x"), ("c", 26, "y"), ("a", 9, "late: [0, 10) closed at source time 10")]
    flow = build(data, Tumbling(0.01), "collect", partitions=1)
    result = flow.run(runtime="simulator", parallelism=2, seed=5)
    # results of one close time come in an order of their keys' hashes: compared sorted
    assert sorted((r.end, r.key, r.start, [x[2] for x in r.value]) for r in result.output("out")) == [
        (0.01, "a", 0.0, ["x", "y", "w", "v"]), (0.01, "b", 0.0, ["z", "u"]), (0.02, "a", 0.01, ["x"]), (0.03, "c", 0.02, ["x", "y"]), (0.04, "a", 0.03, ["x"])]
    assert result.output("late") == [Late("a", data[-1], 0.009)]
    assert result.metrics.late_elements == {"window": 1}
    assert result.output("out") == reference_outputs(flow)["out"]


def test_sessions_grow_merge_and_close_a_gap_after_their_last_element():
    # gap 5 ms (event times): a at 0 and 3 make one session, b at 1 its own; a at 9 starts a
    # new one (9 - 3 >= 5); a at 7, next in t order, is within 5 of both and merges them
    data = [("a", 0, "p"), ("a", 3, "q"), ("b", 1, "r"), ("a", 9, "s"), ("a", 7, "t"), *[("z", 40, "-")] * 20]
    flow = build(data, Session(0.005), "collect", partitions=1)
    result = flow.run(runtime="simulator", parallelism=3, seed=4)
    sessions = sorted((r.key, r.start, r.end, [x[2] for x in r.value]) for r in result.output("out") if r.key != "z")
    assert sessions == [("a", 0.0, 0.014, ["p", "q", "s", "t"]), ("b", 0.001, 0.006, ["r"])]
    assert result.output("out") == reference_outputs(flow)["out"]


def test_allowed_lateness_keeps_a_window_open_longer():
    data = [("a", 0, "x"), *[("z", i, "-") for i in range(1, 12)], ("a", 5, "y")]  # ("a", 5) at source time 12
    strict = build(data, Tumbling(0.01), "count", partitions=1).run(runtime="simulator", seed=1)
    lenient = build(data, Tumbling(0.01), "count", lateness=0.005, partitions=1).run(runtime="simulator", seed=1)
    assert [r.value for r in strict.output("out") if r.key == "a"] == [1] and len(strict.output("late")) == 1
    assert [r.value for r in lenient.output("out") if r.key == "a"] == [2] and lenient.output("late") == []


@pytest.mark.parametrize("assigner,aggregate", [(Sliding(0.02, 0.01), "fold"), (Sliding(0.02, 0.005), "count"), (Session(0.004), "fold")],
                         ids=["sliding", "sliding-panes", "session"])
def test_exactly_once_windows_survive_simulated_crashes(assigner, aggregate):
    """Seeded crashes (1 or 2 per run, at every protocol point) while windows are open across
    snapshots: restored windows get their timers back before any source starts, and a window
    emitted at the very watermark of a snapshot is emitted again by the replay. A sliding
    count is kept in panes (ordering/paned_windows.py): a restored pane sets the timers of its
    windows that close at or after the snapshot's watermark, and no other."""
    data = [("abc"[i % 3], i - (i % 7) * 3, "xyz"[i % 3]) for i in range(60)]
    flow = build(data, assigner, aggregate, lateness=0.002, partitions=3)
    expected = reference_outputs(flow)
    assert expected["late"] and len(expected["out"]) > 10
    # At least 40 seeds (at 40: 32 to 39 restores of a committed snapshot), then on (up to 150)
    # only until the restores asserted below have happened.
    wrong, restored = crashed_runs_differing(flow, expected, 150, enough=lambda seeds, restored: seeds >= 40 and restored > 30)
    assert not wrong, f"seeds whose output differs (seed, crash points): {wrong[:5]}"
    assert restored > 30  # recoveries from a committed snapshot, with windows open in it


def test_a_window_needs_a_keyed_stream_and_an_assigner():
    flow = Flow("bad")
    keyed = flow.source(MemorySource([1])).key_by(lambda x: x)
    with pytest.raises(FlowError, match="Tumbling"):
        keyed.window(60)
    with pytest.raises(FlowError, match="allowed_lateness"):
        keyed.window(Tumbling(1), allowed_lateness=-1)
    with pytest.raises(AttributeError):
        flow.source(MemorySource([1])).window(Tumbling(1))


def test_a_failing_timestamp_names_the_step_and_the_element():
    flow = Flow("ts")
    (flow.source(MemorySource([{"t": 1}, {"no t": 2}])).key_by(lambda x: 0)
         .window(Tumbling(1), timestamp=lambda x: x["t"]).count().sink(MemorySink("out")))
    with pytest.raises(Exception, match=r"window.*no t"):
        flow.run(runtime="simulator")


def _event_or_raise(x) -> float:
    if x[2] == "?":
        raise ValueError(f"no event time in {x!r}")
    return x[1] / 1000


def _poisoned(items: list, assigner, partitions: int) -> Flow:
    """Windows whose timestamp function raises on the elements of value "?" (poison pills)."""
    flow = Flow("pills").dead_letters(MemorySink("dlq"))
    (flow.source(MemorySource(items, partitions=partitions)).key_by(lambda x: x[0])
         .window(assigner, timestamp=_event_or_raise, on_error="dead-letter").fold("", lambda acc, x: acc + x[2])
         .late(MemorySink("late")).sink(MemorySink("out")))
    return flow


@settings(max_examples=60, deadline=None)
@given(data=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60), st.sampled_from("xy?")), max_size=40),
       assigner=assigners, parallelism=st.integers(1, 3), partitions=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_a_timestamp_that_raises_sends_the_element_to_dead_letters_in_any_arrival_order(data, assigner, parallelism, partitions, seed):
    flow = _poisoned(data, assigner, partitions)
    expected = reference_outputs(flow)
    result = flow.run(runtime="simulator", parallelism=parallelism, seed=seed)
    assert result.output("out") == expected["out"] and result.output("late") == expected["late"]
    assert result.output("dlq") == expected["dlq"]
    assert [d.element for d in expected["dlq"]] == [x for x in data if x[2] == "?"]  # each pill once, in t order
    assert result.metrics.step_dead_letters == {"window": len(expected["dlq"])}


def test_timestamp_dead_letters_survive_simulated_crashes_once_each():
    data = [("abc"[i % 3], i - (i % 7) * 3, "xy?"[i % 5 % 3]) for i in range(60)]
    flow = _poisoned(data, Sliding(0.02, 0.01), partitions=3)
    expected = reference_outputs(flow)
    assert len(expected["dlq"]) > 5 and expected["out"]
    wrong, _ = crashed_runs_differing(flow, expected, 60)
    assert not wrong, f"seeds whose output differs (seed, crash points): {wrong[:5]}"


def test_window_dead_letters_need_a_timestamp_function():
    keyed = Flow("bad").source(MemorySource([1])).key_by(lambda x: x)
    with pytest.raises(FlowError, match=r"no timestamp= is given.*\.map\(check, on_error='dead-letter'\)"):
        keyed.window(Tumbling(1), on_error="dead-letter")
    with pytest.raises(FlowError, match="on_error= is 'fail' or 'dead-letter'"):
        keyed.window(Tumbling(1), timestamp=float, on_error="skip")


@pytest.mark.parametrize("assigner,aggregate", [(Tumbling(0.05), "fold"), (Session(0.01), "fold"), (Sliding(0.05, 0.01), "count")],
                         ids=["tumbling", "session", "sliding-panes"])
def test_windows_on_ray_exactly_once_with_a_kill(ray_session, tmp_path, assigner, aggregate):
    data = [("abcd"[i % 4], i - (i % 5) * 20 - (i % 7 == 0) * 200, "xyz"[i % 3]) for i in range(2000)]
    reference = reference_outputs(build(data, assigner, aggregate, lateness=0.01, partitions=2))
    assert reference["late"] and reference["out"]
    flow = build(data, assigner, aggregate, lateness=0.01, partitions=2, name="win-ray", rate=1500,
                 sink=FileSink(tmp_path / "out", name="out"), late_sink=FileSink(tmp_path / "late", name="late"))
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                      faults={"before_commit": ["win-ray/key_by/1"]})
    assert result.metrics.recoveries >= 1
    # JSON sinks write a WindowResult (a Late) as an object of its fields
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == _as_json(reference["out"])
    assert [p for _, p in read_file_sink(tmp_path / "late", "late")] == _as_json(reference["late"])
    # metrics after a recovery are the last incarnation's: it counted the replay's late elements
    assert 0 < result.metrics.late_elements["window"] <= len(reference["late"])


def _as_json(payloads: list) -> list:
    return json.loads(json.dumps(payloads, default=json_default))


def test_status_counts_late_elements_while_the_flow_runs(ray_session, tmp_path):
    data = [("ab"[i % 2], i - (i % 4 == 0) * 100, "x") for i in range(3000)]  # every 4th element 100 ms late
    flow = build(data, Tumbling(0.02), "count", partitions=2, name="win-status", rate=1000,
                 sink=FileSink(tmp_path / "out", name="out"), late_sink=FileSink(tmp_path / "late", name="late"))
    handle = flow.start(parallelism=2)
    try:
        deadline = time.time() + 60
        while not handle.status().get("late_elements", {}).get("window"):
            assert time.time() < deadline, handle.status()
            time.sleep(0.1)
    finally:
        handle.stop(timeout=60)
    assert handle.status()["running"] is False
