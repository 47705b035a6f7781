"""The Kafka sink's ``t_last`` (what a partition already holds, read back on recovery) from a
real broker whose fetch answers come late: the true last Meta at any delay, so a replay
writes nothing twice; past the sink's ``retry_s`` an error naming the sink, never None."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from kafka import TopicPartition

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.kafka.io import LastRecordTimeout, consumer, ensure_topic, read_partition
from driftstream.engine.connectors.kafka.sink import KafkaSink, meta_of
from driftstream.ordering.meta import Meta
from driftstream.engine.testing import wait_for_actor
from tests.engine.connectors.kafka.slow_broker import slow_broker


def _bundles(n: int, size: int) -> list:
    return [Bundle([(Meta(b * size + i + 1, 0, 0, b * size + i + 1), {"i": b * size + i}) for i in range(size)]) for b in range(n)]


def _held(bs: str, topic: str) -> list:
    c = consumer(bs)
    try:
        return [meta_of(r) for r in read_partition(c, TopicPartition(topic, 0), 0, max_s=10.0)]
    finally:
        c.close()


def test_a_replay_through_a_slow_broker_writes_nothing_twice():
    with slow_broker() as (broker, proxy):
        bs, topic = broker.bootstrap_servers, f"sink-slow-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, 1)
        bundles = _bundles(4, 50)
        first = KafkaSink(topic, bs, retry_s=10.0).open(0, 1)
        for b in bundles[:3]:
            first.write(b)
        first.close()
        for delay in (1.2, 3.0):
            proxy.delay_s = delay
            again = KafkaSink(topic, bs, retry_s=10.0).open(0, 1)  # a recovery's new sink partition
            try:
                last = again.t_last()
                assert last == bundles[2].t_last
            finally:
                again.close()
        # The replay from the start: what the partition holds is skipped, the rest written once.
        proxy.delay_s = 0.0
        replay = KafkaSink(topic, bs, retry_s=10.0).open(0, 1)
        try:
            for b in bundles:
                replay.write(b.after(last))
        finally:
            replay.close()
        assert _held(bs, topic) == [m for b in bundles for m, _ in b.elements]


def test_past_retry_s_the_sink_says_it_cannot_tell_what_it_holds():
    with slow_broker() as (broker, proxy):
        bs, topic = broker.bootstrap_servers, f"sink-slow-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, 1)
        writer = KafkaSink(topic, bs).open(0, 1)
        writer.write(_bundles(1, 5)[0])
        writer.close()
        proxy.delay_s = 3.0
        sink = KafkaSink(topic, bs, name="index-out", retry_s=1.0)
        partition = sink.open(0, 1)
        began = time.monotonic()
        try:
            with pytest.raises(LastRecordTimeout) as err:
                partition.t_last()
        finally:
            partition.close()
        took = time.monotonic() - began
        assert 1.0 <= took < 10.0
        text = str(err.value)
        assert text.startswith("LastRecordTimeout: sink 'index-out' cannot tell what")
        assert f"{topic}[0]" in text and bs in text and "retry_s=1" in text and "within 1 s" in text
        assert "A slow broker is not an empty partition" in text


def _kill_at_a_third(bs: str, topic: str, actor: str, before_kill=lambda: None) -> threading.Thread:
    """Kill ``actor`` once the sink's two partitions hold a third of the output (their end
    offsets: ListOffsets, answered at once, only fetches are late). ``killed``: whether it did."""
    import ray

    from tests.engine.control.test_exactly_once import N

    def run() -> None:
        c = consumer(bs)
        try:
            while sum(c.end_offsets([TopicPartition(topic, p) for p in (0, 1)]).values()) < N // 3:
                time.sleep(0.02)
        finally:
            c.close()
        before_kill()
        ray.kill(wait_for_actor(actor, timeout=30), no_restart=True)
        thread.killed = True

    thread = threading.Thread(target=run, daemon=True)
    thread.killed = False
    thread.start()
    return thread


def test_an_exactly_once_run_killed_behind_a_slow_broker_has_no_duplicates(ray_session, tmp_path):
    """On Ray: the sink's stage killed once a third of the output is written, every fetch answer
    1.2 s late from the kill on (the first start's reads of an empty topic need not wait); the
    recovered sinks read back what they hold, and the topic has each output once (at bc7b6d0
    the sinks took the partitions for empty and wrote again)."""
    from driftstream.engine.connectors.kafka.sink import read_kafka_sink
    from tests.engine.control.test_exactly_once import N, build

    with slow_broker() as (broker, proxy):
        bs, topic = broker.bootstrap_servers, f"eo-slow-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, 2)
        killer = _kill_at_a_third(bs, topic, "eo-slow/by_key/1", before_kill=lambda: setattr(proxy, "delay_s", 1.2))
        result = build("eo-slow", KafkaSink(topic, bs), paced=True, rate=2000).run(
            parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
        killer.join(timeout=5)
        proxy.delay_s = 0.0
        got = read_kafka_sink(bs, topic)
    assert killer.killed and result.metrics.recoveries == 1, result.metrics.recovery_s
    metas = [m for m, _ in got]
    assert len(metas) == N and len(set(metas)) == N  # every output once: none written twice


def test_a_recovery_past_retry_s_fails_the_run_with_the_sinks_error(ray_session, tmp_path):
    """On Ray: fetch answers 3 s late from the kill on, the sink's ``retry_s`` 1 s: the run
    fails with the sink's LastRecordTimeout as it is, within seconds (at bc7b6d0 the recovery
    went on and wrote the partitions' output again)."""
    from tests.engine.control.test_exactly_once import build

    with slow_broker() as (broker, proxy):
        bs, topic = broker.bootstrap_servers, f"eo-late-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, 2)
        killer = _kill_at_a_third(bs, topic, "eo-late/by_key/1", before_kill=lambda: setattr(proxy, "delay_s", 3.0))
        began = time.monotonic()
        with pytest.raises(LastRecordTimeout) as err:
            build("eo-late", KafkaSink(topic, bs, retry_s=1.0), paced=True, rate=2000).run(
                parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
        took = time.monotonic() - began
        killer.join(timeout=5)
    assert killer.killed and took < 60.0
    text = str(err.value)
    assert f"sink '{topic}' cannot tell what {topic}[" in text and "within 1 s" in text and "no fetch answer came" in text
