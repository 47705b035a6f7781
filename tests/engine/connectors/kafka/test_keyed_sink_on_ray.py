"""Issue 55 on Ray: a keyed exactly-once count flow (29 keys, Kafka in and out, 4 partitions
each) run at parallelism 2, resumed at 3, then at 1, with an actor killed in each phase
(a sink writer, a counter, then at 1 the one actor of the fused plan, which writes every partition). Every key's records sit in one partition, the one
Kafka's partitioner gives the key, in order and each once; a librdkafka consumer's
compacted view (the last value per key) is the reference's final counts."""

from __future__ import annotations

import json
import threading
import time

import pytest
import ray

from driftstream.barriers.json_payloads import json_bytes
from driftstream.engine import Flow, KafkaSink, KafkaSource
from driftstream.engine.connectors.kafka.partitioner import kafka_partition
from driftstream.engine.testing import wait_for_actor

from tests.engine.connectors.kafka.librdkafka import consume
from tests.engine.control.test_rescale import KEYS, PHASE, count, feed, reference_counts, topics, wait_released, written

pytestmark = pytest.mark.ray


def slow_json(value) -> bytes:
    """JSON, 1 ms a record: a writer is mid-bundle most of the time, so a kill leaves a
    bundle written to some of its Kafka partitions and not the others (each partition's part
    is encoded, then written, one after the other), and the other writers ahead of it."""
    time.sleep(0.001)
    return json_bytes(value)


def keyed_counts(bs: str, src: str, dst: str) -> Flow:
    flow = Flow("kc")
    (flow.source(KafkaSource(src, bs), name="docs").key_by(lambda d: d["k"], name="by_key")
         .stateful_map(count, name="count").sink(KafkaSink(dst, bs, name="out", key=lambda c: c["k"], encode=slow_json)))
    return flow


def feed_and_kill(bs: str, src: str, dst: str, first: int, victim: str) -> threading.Thread:
    """Feed records ``first`` .. ``first + PHASE - 1`` in chunks while the flow runs, and kill
    ``victim`` once the sink topic holds a third of them: the other instances go on releasing
    until the recovery stops them, so the Kafka partitions stand at different t_lasts."""

    def run():
        handle = wait_for_actor(victim)
        for at in range(first, first + PHASE, 100):
            feed(bs, src, at, 100)
            if handle is not None and written(bs, dst) >= first + PHASE // 3:
                ray.kill(handle, no_restart=True)
                handle = None
            time.sleep(0.05)
        while handle is not None and written(bs, dst) < first + PHASE // 3:
            time.sleep(0.02)
        if handle is not None:
            ray.kill(handle, no_restart=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_keyed_output_keeps_each_key_in_its_partition_through_rescales_and_kills(ray_session, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap_servers
    src, dst = topics(bs)
    options = dict(guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    victims = ["kc/out.by_partition/1", "kc/by_key/2", "kc/docs/0"]  # at 1 the plan is fused: one actor writes every partition
    for phase, parallelism in enumerate((2, 3, 1)):
        killer = feed_and_kill(bs, src, dst, phase * PHASE, victims[phase])
        handle = keyed_counts(bs, src, dst).start(parallelism=parallelism, resume=phase > 0, **options)
        killer.join(timeout=60)
        wait_released(bs, dst, (phase + 1) * PHASE, handle)
        assert not killer.is_alive()
        deadline = time.time() + 60
        while not handle.status()["recoveries"]:  # the kill was noticed and recovered from
            assert time.time() < deadline, handle.status()
            time.sleep(0.1)
        handle.stop(timeout=60)

    expected = reference_counts(bs, src)  # (key, i, n), every record counted once in t order
    messages = consume(bs, dst, list(range(4)), idle_s=1.0)
    partition_of_key: dict = {}
    in_partition: dict = {}  # key -> its (i, n) in offset order
    compacted: dict = {}  # a compacted topic's view: the last value per key
    for msg in messages:  # in offset order within each partition
        key = msg.key().decode()
        value = json.loads(msg.value())
        assert value["k"] == key
        partition_of_key.setdefault(key, set()).add(msg.partition())
        in_partition.setdefault(key, []).append((value["i"], value["n"]))
        compacted[key] = value["n"]
    assert len(partition_of_key) == KEYS
    assert {k: ps for k, ps in partition_of_key.items()} == {k: {kafka_partition(k, 4)} for k in partition_of_key}
    for key, rows in in_partition.items():
        assert [n for _, n in rows] == list(range(1, len(rows) + 1)), key  # in order, each once, no gap
    assert sorted((k, i, n) for k, rows in in_partition.items() for i, n in rows) == expected
    final = {}
    for k, _, n in expected:
        final[k] = max(final.get(k, 0), n)
    assert compacted == final
