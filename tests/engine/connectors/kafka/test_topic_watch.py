"""A topic deleted (or recreated) while a flow runs fails the run naming the connector, the
topic and what happened, instead of a reader that stalls "caught up" for ever and a
dead-letter sink whose writes the broker swallows (Tansu answers both with error 0)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from driftstream.engine import Flow, KafkaSource
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.dead_letter_sink import DeadLetterKafkaSink
from driftstream.engine.connectors.kafka.topic_watch import TopicVanished, TopicWatch, topic_state
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from driftstream.engine.testing import MemorySink


def _topic(kafka_broker, prefix: str, partitions: int = 1, records: int = 20) -> str:
    bs, topic = kafka_broker.bootstrap_servers, f"{prefix}-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, topic, partitions)
    if records:
        w = PartitionWriter(bs, topic, 0)
        w.write([(json.dumps({"i": i}).encode(), []) for i in range(records)])
        w.close()
    return topic


def _delete(bs: str, topic: str, recreate_with: int = 0) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        admin.delete_topics([topic])
        if recreate_with:
            admin.create_topics([NewTopic(topic, num_partitions=recreate_with, replication_factor=1)])
    finally:
        admin.close()


def _read_until_error(reader, timeout_s: float) -> tuple:
    """(error, seconds) reading until ``reader`` raises; fails the test after ``timeout_s``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            reader.read(100)
        except Exception as exc:  # noqa: BLE001 - the error is what the test looks at
            return exc, time.monotonic() - began
        time.sleep(0.01)
    pytest.fail(f"the reader still reads {timeout_s} s after its topic was deleted")


def _read_all(reader, n: int) -> list:
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got.extend(reader.read(100))
    assert len(got) == n
    return got


def test_topic_state_says_whether_a_topic_exists(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = _topic(kafka_broker, "state", partitions=3, records=0)
    assert topic_state(bs, topic).partitions == 3
    assert not topic_state(bs, "no-such-" + topic).exists
    assert topic_state("127.0.0.1:1", topic, timeout_s=0.5) is None  # nobody answered: nothing known
    TopicWatch(bs, topic, 2, "KafkaSource 'x'").check()  # there: nothing raised
    with pytest.raises(TopicVanished, match=r"KafkaSource 'x': topic .* has 3 partitions now, but the flow uses partition 3"):
        TopicWatch(bs, topic, 3, "KafkaSource 'x'").check()


@pytest.mark.parametrize("recreate_with", [0, 1])
def test_a_reader_whose_topic_is_deleted_or_recreated_fails_within_seconds(kafka_broker, recreate_with):
    """Tansu answers the fetches of a deleted topic with error 0 and a high watermark of 0:
    on bc7b6d0 the reader took that for caught up and read nothing, without an error, for ever."""
    bs = kafka_broker.bootstrap_servers
    topic = _topic(kafka_broker, "gone")
    source = KafkaSource(topic, bs, tick_interval=None)
    source.step_name = "events"
    reader = source.open(0, 0)
    try:
        _read_all(reader, 20)
        _delete(bs, topic, recreate_with)
        error, took = _read_until_error(reader, 20)
    finally:
        reader.close()
    print(f"\ntopic {'recreated' if recreate_with else 'deleted'} -> the reader failed after {took:.1f} s: {error}")
    assert isinstance(error, TopicVanished), repr(error)
    if recreate_with:
        assert f"partition 0 of topic {topic!r}" in str(error) and "ends at offset 0, below offset 20" in str(error)
        assert "fresh=True" in str(error)
    else:
        assert f"KafkaSource 'events': topic {topic!r} does not exist any more at {bs}" in str(error)
    assert took < 10


def test_an_idle_reader_at_offset_0_finds_its_topic_gone_by_metadata(kafka_broker, monkeypatch):
    """Nothing read, no ticks: the high watermark (0) says nothing; the periodic metadata check does."""
    monkeypatch.setattr("driftstream.engine.connectors.kafka.source.TOPIC_CHECK_S", 0.5)
    bs = kafka_broker.bootstrap_servers
    topic = _topic(kafka_broker, "idle-gone", records=0)
    reader = KafkaSource(topic, bs, tick_interval=None).open(0, 0)
    try:
        assert reader.read(10) == []
        _delete(bs, topic)
        error, took = _read_until_error(reader, 20)
    finally:
        reader.close()
    assert isinstance(error, TopicVanished) and "does not exist any more" in str(error)
    assert took < 10


def test_a_flow_whose_source_topic_is_deleted_fails_with_the_error(ray_session, kafka_broker, tmp_path):
    """On bc7b6d0 the run stayed "running", without an error, for >= 600 s."""
    bs = kafka_broker.bootstrap_servers
    topic = _topic(kafka_broker, "flow-gone", partitions=2, records=50)
    flow = Flow(f"gone-{topic}")
    flow.source(KafkaSource(topic, bs), name="events").map(lambda e: e["i"]).sink(MemorySink("out"))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 60
        while handle.status()["released"] < 50:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        _delete(bs, topic)
        deleted = time.time()
        with pytest.raises(TopicVanished, match=f"KafkaSource 'events': topic {topic!r} does not exist any more"):
            handle.wait(timeout=60)
        took = time.time() - deleted
    finally:
        if handle.status().get("running"):
            handle.stop(timeout=10)
    print(f"\nsource topic deleted -> the run failed after {took:.1f} s")
    assert took < 20


def test_a_dead_letter_topic_deleted_while_the_flow_runs_fails_the_write(kafka_broker):
    """Tansu accepts writes to a deleted topic with error 0: the letters went nowhere. The
    dead-letter sink asks the metadata after each write."""
    bs = kafka_broker.bootstrap_servers
    topic = _topic(kafka_broker, "dlq-gone", records=0)
    sink = DeadLetterKafkaSink(topic, bs, name="dead_letters")
    part = sink.open(0, 1)
    try:
        from driftstream.barriers.bundle import Bundle

        meta = (1, 0, 0, 0, (), False)
        part.write(Bundle([(meta, {"letter": 1})]))  # the topic is there: written
        _delete(bs, topic)
        began = time.monotonic()
        with pytest.raises(TopicVanished, match=f"sink 'dead_letters': topic {topic!r} does not exist any more"):
            part.write(Bundle([((2, 0, 0, 1, (), False), {"letter": 2})]))
        assert time.monotonic() - began < 10
    finally:
        part.close()
