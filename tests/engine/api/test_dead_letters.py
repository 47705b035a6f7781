"""Poison pills: a step with ``on_error="dead-letter"`` sends an element its function raises
on to the flow's dead-letter sink and goes on. The dead letters, like the output, are a
function of the input: the sequential reference's for any arrival order, parallelism and
crash, once each under exactly-once; state is as if the element had not come."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine import Flow, MapState
from driftstream.engine.model.errors import DeadLetter, FlowError
from driftstream.engine.model.steps import MERGE, SINK
from driftstream.engine.testing import MemorySink, MemorySource, wait_for_actor
from tests.reference import crashed_runs_differing, reference_outputs


def checked(x: tuple) -> tuple:
    if x[1] == -1:
        raise ValueError(f"no value in {x!r}")
    return x


def expanded(x: tuple):
    yield x  # an output before the failure: none of the element's outputs may leave
    if x[1] == -2:
        raise RuntimeError("cannot expand")
    if x[1] % 5 == 0:
        yield (x[0], x[1] + 100)


def kept(x: tuple) -> bool:
    if x[1] == -3:
        raise TypeError("cannot filter")
    return x[1] != 13


def key_of(x: tuple) -> str:
    if x[1] == 17:
        raise KeyError("no key")
    return x[0]


def running_total(total, x):
    total = (total or 0) + x[1]
    if x[1] % 6 == 5 and total > 30:  # depends on the state: on what came before in t
        raise OverflowError(f"total {total} too high")
    return total, (x[0], total)


def distinct_values(entries: MapState, x):
    entries.put(x[1], True)  # written before the failure: must be undone
    if len(entries) > 4 and x[1] % 4 == 1:
        raise ValueError("too many values")
    return [(x[0], len(entries))] * (1 + x[1] % 2)


def build(items: list, partitions: int = 2, state: str = "value") -> Flow:
    flow = Flow("poison").dead_letters(MemorySink("dlq"))
    keyed = (flow.source(MemorySource(items, partitions=partitions))
             .map(checked, on_error="dead-letter").flat_map(expanded, on_error="dead-letter")
             .filter(kept, on_error="dead-letter").key_by(key_of, on_error="dead-letter"))
    if state == "value":
        keyed.stateful_map(running_total, on_error="dead-letter").sink(MemorySink("out"))
    else:
        keyed.stateful_flat_map(distinct_values, state=MapState, on_error="dead-letter").sink(MemorySink("out"))
    return flow


items = st.lists(st.tuples(st.sampled_from("abc"), st.integers(-3, 20)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(data=items, state=st.sampled_from(["value", "entries"]), parallelism=st.integers(1, 4), partitions=st.integers(1, 3),
       seed=st.integers(0, 2**32))
def test_any_arrival_order_gives_the_sequential_output_and_dead_letters(data, state, parallelism, partitions, seed):
    flow = build(data, partitions, state)
    result = flow.run(runtime="simulator", parallelism=parallelism, seed=seed)
    expected = reference_outputs(flow)
    assert result.output("out") == expected["out"]
    assert result.output("dlq") == expected["dlq"]
    assert result.metrics.dead_letters == len(expected["dlq"]) == sum(result.metrics.step_dead_letters.values())


def test_a_dead_letter_names_the_step_the_element_its_t_and_the_error():
    flow = build([("a", 1), ("a", -1), ("b", 17), ("a", 29), ("a", 5)], partitions=1)
    result = flow.run(runtime="simulator")
    letters = result.output("dlq")
    assert [(d.step, d.element, d.t[:4], d.error.split(":")[0]) for d in letters] == [
        ("map", ("a", -1), (1, 0, 0, 1), "ValueError"),
        ("key_by", ("b", 17), (2, 0, 0, 2), "KeyError"),
        ("stateful_map", ("a", 5), (4, 0, 0, 4), "OverflowError"),
    ]
    assert all("Traceback" in d.traceback and "stage.py" not in d.traceback for d in letters)  # the user's frames
    assert 'raise OverflowError(f"total {total} too high")' in letters[2].traceback
    # the state is as if the failing element had not come: 1, 1 + 29, then ("a", 5)'s sibling
    # from the flat_map, ("a", 105): 30 + 105
    assert result.output("out") == [("a", 1), ("a", 30), ("a", 135)]
    assert result.metrics.step_dead_letters == {"map": 1, "flat_map": 0, "filter": 0, "key_by": 1, "stateful_map": 1}


def test_entries_written_before_the_failure_are_undone():
    flow = build([("a", v) for v in (2, 4, 6, 8, 9, 12)], partitions=1, state="entries")
    result = flow.run(runtime="simulator")
    assert [d.element for d in result.output("dlq")] == [("a", 9)]
    assert result.output("out")[-1] == ("a", 5)  # 2, 4, 6, 8, 12: the 9 is not among them


@pytest.mark.parametrize("state", ["value", "entries"])
def test_dead_letters_survive_simulated_crashes_once_each(state):
    data = [("abc"[i % 3], (i * 7) % 24 - 3) for i in range(60)]
    flow = build(data, partitions=3, state=state)
    expected = reference_outputs(flow)
    assert len(expected["dlq"]) > 5
    # At least 40 seeds (at 40: 13 restores of a committed snapshot with state="value", 7 with
    # "entries"), then on (up to 100) only until the restores asserted below have happened.
    wrong, restored = crashed_runs_differing(flow, expected, 100, enough=lambda seeds, restored: seeds >= 40 and restored > 6)
    assert not wrong, f"seeds whose output differs (seed, crash points): {wrong[:5]}"
    assert restored > 6  # recoveries from a committed snapshot, dead letters' state in it


def test_on_error_and_the_dead_letter_sink_are_checked_when_built():
    flow = Flow("bad")
    with pytest.raises(FlowError, match="on_error= is 'fail' or 'dead-letter'"):
        flow.source(MemorySource([1])).map(abs, on_error="skip")
    flow.source(MemorySource([1])).map(abs, on_error="dead-letter").sink(MemorySink("out"))
    with pytest.raises(FlowError, match=r"no dead-letter sink.*flow.dead_letters\(sink\)"):
        flow.plan()
    with pytest.raises(FlowError, match="takes a Sink"):
        flow.dead_letters("dlq")
    named = Flow("named").dead_letters(MemorySink("dlq"))
    named.source(MemorySource([1])).map(abs, on_error="dead-letter").sink(MemorySink("dlq"))
    with pytest.raises(FlowError, match="'dlq' is taken by the flow's dead-letter sink"):
        named.plan()


def test_without_dead_letters_a_failure_still_stops_the_run():
    flow = Flow("strict")
    flow.source(MemorySource([("a", 1), ("a", -1)])).map(checked).sink(MemorySink("out"))
    with pytest.raises(Exception, match=r"step 'map' failed on element value \('a', -1\)"):
        flow.run(runtime="simulator")


def _pill_flow(source, sink, dlq=None, name: str = "pill") -> Flow:
    flow = Flow(name)
    if dlq is not None:
        flow.dead_letters(dlq)
    (flow.source(source, name="events").key_by(lambda e: e["user"], name="user")
         .stateful_map(_sum_of_n, name="total", on_error="dead-letter").sink(sink))
    return flow


def _sum_of_n(total, e):
    total = (total or 0) + e["n"]  # the pill's n is a string: TypeError
    return total, {"user": e["user"], "total": total}


def test_a_poison_pill_in_a_kafka_flow_exactly_once_with_a_kill(ray_session, kafka_broker, tmp_path):
    """One element makes the stateful step raise; a stateful actor is killed after its dead
    letter was written. Exactly one dead letter (in the source topic's .dlq), and the output is
    that of the same input without the pill."""
    import ray
    from kafka import KafkaProducer

    from driftstream.engine import KafkaSink, KafkaSource
    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.kafka.sink import read_kafka_sink

    events = [{"user": f"u{i % 5}", "n": i} for i in range(1500)]
    pill = {"user": "u3", "n": "not a number"}
    with_pill = events[:700] + [pill] + events[700:]
    reference = reference_outputs(_pill_flow(MemorySource(with_pill, partitions=2), MemorySink("out"), MemorySink("dlq")))
    without = reference_outputs(_pill_flow(MemorySource(events, partitions=2), MemorySink("out"), MemorySink("dlq")))
    assert reference["out"] == without["out"] and [d.element for d in reference["dlq"]] == [pill]

    bootstrap, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    topic, out = f"pill-{tag}", f"pill-out-{tag}"
    ensure_topic(bootstrap, topic, 2)
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20)
    # Records the source cannot decode, among the events: dead letters of the source step.
    bad = {100: (None, b'{"user": "u1", broken'), 900: (b"k-null", None), 1300: (None, b"\xff" * 1_500_000)}
    for i, e in enumerate(with_pill):  # timestamps as the MemorySource's times: the same t order
        if i in bad:
            producer.send(topic, key=bad[i][0], value=bad[i][1], partition=i % 2, timestamp_ms=i)
        producer.send(topic, json.dumps(e).encode(), partition=i % 2, timestamp_ms=i)
    producer.flush()
    producer.close()
    flow = _pill_flow(KafkaSource(topic, bootstrap), KafkaSink(out, bootstrap), name=f"pill-{tag}")
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 120
        while not read_kafka_sink(bootstrap, f"{topic}.dlq"):  # the pill's dead letter is written
            assert time.time() < deadline, handle.status()
            time.sleep(0.1)
        ray.kill(wait_for_actor(f"pill-{tag}/user/1", timeout=30), no_restart=True)
        while len(read_kafka_sink(bootstrap, out)) < len(reference["out"]) or not handle.status()["recoveries"]:
            assert time.time() < deadline, handle.status()
            time.sleep(0.2)
        status = handle.status()
    finally:
        handle.stop(timeout=60)
    assert [p for _, p in read_kafka_sink(bootstrap, out)] == reference["out"]
    letters = [p for _, p in read_kafka_sink(bootstrap, f"{topic}.dlq")]  # each once: the source's and the step's
    steps = [d for d in letters if d["step"] == "total"]
    assert len(steps) == 1 and steps[0]["element"] == pill
    assert steps[0]["error"].startswith("TypeError") and "_sum_of_n" in steps[0]["traceback"]
    records = sorted((d for d in letters if d["step"] == "events"), key=lambda d: d["t"])
    assert [(d["element"]["partition"], d["element"]["timestamp"]) for d in records] == [(i % 2, i) for i in sorted(bad)]
    broken, null, big = (d["element"] for d in records)
    assert broken["value"] == '{"user": "u1", broken' and "JSONDecodeError" in records[0]["error"]
    assert null["key"] == "k-null" and null["value"] is None and null["value_size"] == -1 and "NullValue" in records[1]["error"]
    assert big["encoding"] == "base64" and big["truncated"] and big["value_size"] == 1_500_000 and len(big["value"]) == len(base64.b64encode(bytes(64 * 1024)))
    assert len(letters) == 4 and status["recoveries"]


def test_dead_letter_records_are_dataclasses_json_sinks_write_as_objects():
    letter = DeadLetter("parse", {"raw": "x"}, (1, 0, 0, 7, ()), "ValueError: x", "Traceback ...")
    from driftstream.barriers.json_payloads import json_default

    assert json.loads(json.dumps(letter, default=json_default)) == {
        "step": "parse", "element": {"raw": "x"}, "t": [1, 0, 0, 7, []], "error": "ValueError: x", "traceback": "Traceback ...",
        "truncated": False, "element_size": None}


def test_a_kafka_sources_bad_records_go_to_its_own_topic_and_step_failures_share_it():
    """Per destination one sink (two writers of one topic partition would break its t_last)."""
    from driftstream.engine import KafkaSink, KafkaSource

    def sinks(flow: Flow) -> dict:
        return {s.name: s.sink.topic for s in flow.steps_to_run() if s.kind.is_sink and isinstance(s.sink, KafkaSink)}

    one = Flow("one")
    one.source(KafkaSource("a", "b:9092"), name="a").map(abs, on_error="dead-letter").sink(MemorySink("out"))
    assert sinks(one) == {"dead_letters": "a.dlq"}
    assert [s.kind for s in one.steps_to_run()][-2:] == [MERGE, SINK]  # the source's letters and the map's
    two = Flow("two")
    two.source(KafkaSource("a", "b:9092"), name="a").sink(MemorySink("out_a"))
    two.source(KafkaSource("c", "b:9092"), name="c").sink(MemorySink("out_c"))
    assert sinks(two) == {"dead_letters.a.dlq": "a.dlq", "dead_letters.c.dlq": "c.dlq"}
    two.source(MemorySource([1]), name="m").map(abs, on_error="dead-letter").sink(MemorySink("out_m"))
    with pytest.raises(FlowError, match=r"step 'map' sends its failures to dead letters.*several Kafka sources"):
        two.steps_to_run()
    two.dead_letters(MemorySink("dlq"))
    assert sinks(two) == {} and [s.name for s in two.steps_to_run()][-2:] == ["dlq.all", "dlq"]


def test_a_fused_key_by_diverts_the_same_dead_letters_as_a_keyed_channel():
    """At parallelism 1 the key_by computes its key in its input's stage (fused): its dead
    letters, their tracebacks and the counts are those of the unfused layout."""
    flow = build([("a", 1), ("a", -1), ("b", 17), ("a", 29), ("a", 5), ("c", 3)], partitions=2)
    assert flow.plan(1).fused and not flow.plan(1, fuse=False).fused
    fused, unfused = flow.run(runtime="simulator", seed=4), flow.run(runtime="simulator", seed=4, fuse=False)
    letters = [[(d.step, d.element, d.t, d.error, d.traceback) for d in r.output("dlq")] for r in (fused, unfused)]
    assert letters[0] == letters[1] and [s for s, *_ in letters[0]].count("key_by") == 1
    assert fused.output("out") == unfused.output("out")
    assert fused.metrics.step_dead_letters == unfused.metrics.step_dead_letters
