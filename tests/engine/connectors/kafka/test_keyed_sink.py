"""A keyed KafkaSink on the local broker, without Ray: records carry their key and sit in the
partition Kafka's partitioner gives it, in t order; after a recovery each Kafka partition
drops the replayed elements it holds (per partition, not the barrier's single t_last); the
flow puts the shuffle before the sink; and a keyed flow in the simulator."""

from __future__ import annotations

import uuid

import pytest
from kafka.record.memory_records import MemoryRecords

from driftstream.barriers.barrier import Barrier
from driftstream.barriers.bundle import Bundle
from driftstream.engine import Flow, KafkaSink
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.partitioner import kafka_partition
from driftstream.engine.connectors.kafka.record_batch import encoded_batches, python_batches
from driftstream.engine.connectors.kafka.sink import meta_of
from driftstream.engine.connectors.kafka.wire import record_batches
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.sink_release import SinkRelease
from driftstream.engine.testing import MemorySource
from driftstream.ordering.meta import Meta

from tests.engine.connectors.kafka.librdkafka import consume

P = 4


def decoded(batches) -> list:
    out = []
    for b in batches:
        out.extend((r.key, r.value, r.headers) for r in MemoryRecords(b.buffer()).next_batch())
    return out


@pytest.mark.parametrize("build", ["c-or-python", "python", "gzip"])
def test_a_keyed_record_carries_its_key_in_every_encoder(build):
    records = [(b"v1", [("h", b"1")], b"k1"), (b"v2", [], b"")]
    if build == "c-or-python":
        batches = list(encoded_batches(records, 1 << 20))
    elif build == "python":
        batches = list(python_batches(records, 1 << 20, 0))
    else:
        batches = list(record_batches(records, compression_type=1))
    assert decoded(batches) == [(b"k1", b"v1", [("h", b"1")]), (b"", b"v2", [])]
    assert decoded(encoded_batches([(b"v", [])], 1 << 20)) == [(None, b"v", [])]  # unkeyed: a null key, as before


def topic(bs: str) -> str:
    name = f"keyed-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, name, P)
    return name


def element(i: int, key: str) -> tuple:
    return Meta(i, 0, 0, i), {"k": key, "i": i}


def by_partition(bs: str, name: str) -> dict:
    """Kafka partition -> [(key, i, Meta)] in offset order, read by librdkafka."""
    out: dict = {}
    for msg in consume(bs, name, list(range(P)), idle_s=0.5):
        meta = meta_of(type("R", (), {"headers": msg.headers()})())
        out.setdefault(msg.partition(), []).append((msg.key().decode(), eval(msg.value())["i"], meta))  # noqa: S307 - JSON of ints and str
    return out


def test_each_record_goes_to_its_keys_partition_in_t_order(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    name = topic(bs)
    sink = KafkaSink(name, bs, key=lambda d: d["k"])
    part = sink.open(0, 2)  # any instance may write any partition: the routing chooses
    keys = [f"k{j}" for j in range(13)]
    part.write(Bundle([element(i, keys[i % 13]) for i in range(60)]))
    part.write(Bundle([element(i, keys[i % 13]) for i in range(60, 100)]))
    part.close()
    got = by_partition(bs, name)
    assert sum(map(len, got.values())) == 100 and len(got) > 1
    for p, rows in got.items():
        assert all(kafka_partition(k, P) == p for k, _, _ in rows)
        assert [i for _, i, _ in rows] == sorted(i for _, i, _ in rows)  # t order
        assert [m for _, _, m in rows] == [Meta(i, 0, 0, i) for _, i, _ in rows]


def test_a_recovery_drops_per_partition_what_each_holds(kafka_broker):
    """A bundle that was only partly written (some Kafka partitions have their part, some not):
    the replay must write exactly the missing parts. The barrier alone (one t_last) cannot:
    the newest partition's t_last would drop the others' missing elements."""
    bs = kafka_broker.bootstrap_servers
    name = topic(bs)
    sink = KafkaSink(name, bs, key=lambda d: d["k"])
    keys = [f"k{j}" for j in range(19)]
    assert {kafka_partition(k, P) for k in keys} == set(range(P))
    elements = [element(i, keys[i % 19]) for i in range(80)]
    first = sink.open(0, 1)
    first.write(Bundle(elements[:30]))
    # The crash: the next bundle reached partitions 0 and 2 only.
    landed = {0, 2}
    first.write(Bundle([e for e in elements[30:] if kafka_partition(e[1]["k"], P) in landed]))
    first.close()

    barrier = Barrier()
    part = sink.open(0, 1)
    release = SinkRelease({0: (barrier, part)})
    release.skip_released()
    holds = part.t_lasts()
    assert barrier.t_last == max(holds.values())  # the newest output the topic holds: drains, at-most-once
    assert barrier._drop_through == min(holds.values())  # every partition holds what is at or before it
    for meta, payload in elements:  # the replay, from the beginning
        barrier.add(meta, payload)
    release.release_all((1000,))
    part.close()
    got = by_partition(bs, name)
    assert sorted(i for rows in got.values() for _, i, _ in rows) == list(range(80))  # each once
    for p, rows in got.items():
        assert [i for _, i, _ in rows] == sorted(i for _, i, _ in rows)
    assert part.dropped_replayed + barrier.dropped_replayed == 30 + sum(1 for e in elements[30:] if kafka_partition(e[1]["k"], P) in landed)


def test_a_key_that_is_not_bytes_or_str_fails_naming_the_sink_and_element(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    part = KafkaSink(topic(bs), bs, name="out", key=lambda d: d["i"]).open(0, 1)
    with pytest.raises(TypeError, match=r"sink 'out': key= of \{'k': 'a', 'i': 7\} at t=.*bytes or str, not int"):
        part.write(Bundle([element(7, "a")]))
    part.close()


def test_the_flow_shuffles_by_partition_before_a_keyed_sink_only():
    flow = Flow("kp")
    src = flow.source(MemorySource([{"k": "a"}]), name="src")
    src.sink(KafkaSink("t1", "127.0.0.1:1", name="keyed", key=lambda d: d["k"]))
    src.sink(KafkaSink("t2", "127.0.0.1:1", name="plain"))
    plan = flow.plan(3)
    assert [s.steps for s in plan.stages] == [["src", "plain"], ["keyed.by_partition", "keyed"]]
    assert [s.name for s in plan.keyed_stages] == ["keyed.by_partition"]
    with pytest.raises(FlowError, match="used twice"):
        src.sink(KafkaSink("t3", "127.0.0.1:1", name="plain", key=str))
    with pytest.raises(FlowError, match="key= takes a function"):
        KafkaSink("t4", "127.0.0.1:1", key="k")


def count(n, doc):
    n = (n or 0) + 1
    return n, {"k": doc["k"], "i": doc["i"], "n": n}


def test_a_keyed_count_flow_in_the_simulator_keeps_each_key_in_its_partition(kafka_broker):
    """Parallelism 3 over 4 partitions (one instance writes two): each key's counts 1..n in
    its partition, in order."""
    bs = kafka_broker.bootstrap_servers
    name = topic(bs)
    docs = [{"k": f"k{i % 11}", "i": i} for i in range(300)]
    flow = Flow("keyed-sim")
    (flow.source(MemorySource(docs, partitions=2), name="docs").key_by(lambda d: d["k"], name="by_key")
         .stateful_map(count, name="count").sink(KafkaSink(name, bs, name="out", key=lambda c: c["k"])))
    flow.run(runtime="simulator", parallelism=3, seed=4)
    got = by_partition(bs, name)
    assert sum(map(len, got.values())) == 300
    for p, rows in got.items():
        per_key: dict = {}
        for k, i, _ in rows:
            assert kafka_partition(k, P) == p
            per_key.setdefault(k, []).append(i)
        for k, seen in per_key.items():
            assert seen == [d["i"] for d in docs if d["k"] == k]  # in order, each once
