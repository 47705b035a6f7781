"""The window, session and join examples: each equals the sequential reference on the
simulator; page views also through Kafka on Ray, exactly-once with a kill."""

from __future__ import annotations

import time
import uuid

import pytest

from driftstream.barriers.json_payloads import json_default
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.examples import enrichment, page_views, sessions
from driftstream.examples.clicks import clicks
from driftstream.engine.testing import wait_for_actor
from tests.reference import reference_outputs


@pytest.mark.parametrize("example, data", [(page_views, clicks(800)), (sessions, clicks(800)), (enrichment, enrichment.events(600))],
                         ids=["page_views", "sessions", "enrichment"])
def test_each_example_equals_the_sequential_reference(example, data):
    flow = example.build(data)
    expected = reference_outputs(flow)
    result = flow.run(runtime="simulator", parallelism=3, seed=11)
    for sink, payloads in expected.items():
        assert result.output(sink) == payloads, sink
    assert any(expected.values())


def test_late_clicks_are_counted_and_none_is_lost():
    data = clicks(800)
    result = page_views.build(data).run(runtime="simulator", parallelism=2, seed=3)
    late = result.output("late")
    assert late and result.metrics.late_elements["minutes"] == len(late)
    # every click is in exactly one per-minute count or in the late sink
    assert sum(r.value for r in result.output("per_minute")) + len(late) == len(data)


def test_page_views_from_kafka_exactly_once_with_a_kill(ray_session, kafka_broker, tmp_path):
    import json

    from kafka import KafkaProducer

    from driftstream.engine.connectors.kafka.io import ensure_topic

    data = clicks(600)
    expected = reference_outputs(page_views.build(data))
    bootstrap, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    topic, out = f"clicks-{tag}", f"views-{tag}"
    ensure_topic(bootstrap, topic, 2)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i, c in enumerate(data):  # the record timestamp: when the click was logged
        producer.send(topic, json.dumps(c).encode(), partition=i % 2, timestamp_ms=int(c["logged"] * 1000))
    producer.flush()
    producer.close()
    flow = page_views.kafka_flow(bootstrap, topic, out, name=f"views-{tag}")
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    try:
        # the source's ticks move an idle partition's time to now: every window closes
        deadline, killed = time.time() + 120, False
        # The kill comes once a snapshot is committed, asked of status(): a read of the sink
        # topic can take seconds, long enough for the run to write everything before it.
        while not handle.status()["snapshots"]:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        import ray

        ray.kill(wait_for_actor(f"views-{tag}/by_page/1", timeout=30), no_restart=True)
        killed = True
        while len(read_kafka_sink(bootstrap, out)) < len(expected["per_minute"]):
            assert time.time() < deadline, handle.status()
            time.sleep(0.2)
        while killed and not handle.status()["recoveries"]:  # the replay after the kill must add nothing
            assert time.time() < deadline, handle.status()
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        handle.stop(timeout=60)
    assert killed
    as_json = json.loads(json.dumps(expected["per_minute"], default=json_default))
    assert [p for _, p in read_kafka_sink(bootstrap, out)] == as_json
    assert [p for _, p in read_kafka_sink(bootstrap, f"{out}.late")] == json.loads(json.dumps(expected["late"], default=json_default))
