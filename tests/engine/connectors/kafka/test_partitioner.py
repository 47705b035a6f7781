"""Kafka's default partitioner (murmur2) as the keyed KafkaSink computes it: Kafka's own test
vectors, kafka-python's implementation over random keys, librdkafka's ``murmur2_random``
producer on a real broker for the same keys, and the routing of Kafka partitions to instances."""

from __future__ import annotations

import os
import random
import uuid

import pytest
from confluent_kafka import Producer

from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.partitioner import PartitionRoute, kafka_partition, key_bytes, murmur2, routing_keys
from driftstream.ordering.key_groups import KeyGroups

from tests.engine.connectors.kafka.librdkafka import QUIET

#: org.apache.kafka.common.utils.UtilsTest#testMurmur2
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_gives_kafkas_test_vectors():
    assert {k: murmur2(k) for k in KAFKA_VECTORS} == KAFKA_VECTORS


def test_murmur2_agrees_with_kafka_python_on_random_keys():
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2  # unsigned, the same bits

    rng = random.Random(5)
    for _ in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


def test_a_key_is_bytes_or_str():
    assert kafka_partition("k1", 7) == kafka_partition(b"k1", 7) == kafka_partition(bytearray(b"k1"), 7)
    with pytest.raises(TypeError, match="bytes or str, not int"):
        key_bytes(12)


def test_each_key_lands_where_librdkafkas_murmur2_random_puts_it(kafka_broker):
    """librdkafka (the client of most non-Java producers) with ``partitioner=murmur2_random``,
    Java's default for keyed records: each of 600 keys in the partition kafka_partition says."""
    bs = kafka_broker.bootstrap_servers
    for partitions in (4, 7):
        topic = f"murmur-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, partitions)
        producer = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "linger.ms": 5, **QUIET})
        landed: dict = {}
        keys = [f"k{i}" for i in range(300)] + [os.urandom(random.Random(i).randrange(1, 30)) for i in range(300)]

        def delivered(err, msg):
            assert err is None, err
            landed[msg.key()] = msg.partition()

        for key in keys:
            producer.produce(topic, value=b"v", key=key, on_delivery=delivered)
        assert producer.flush(30) == 0
        assert len(landed) == len(set(key_bytes(k) for k in keys))
        assert {k: kafka_partition(k, partitions) for k in landed} == landed
        assert len(set(landed.values())) == partitions  # every partition used: the test tells partitions apart


@pytest.mark.parametrize("partitions", [1, 4, 5, 16])
def test_routing_spreads_partitions_evenly_over_instances(partitions):
    """Partition p's routing key falls in the middle of its share of the key groups: at each
    parallelism every instance gets floor or ceil of partitions/parallelism partitions (while
    there are at least as many partitions as instances)."""
    groups = KeyGroups(128)
    keys = routing_keys(partitions, 128)
    assert len(set(keys)) == partitions
    for parallelism in range(1, 9):
        owners = [groups.owner(groups.group_of(k), parallelism) for k in keys]
        per_instance = [owners.count(i) for i in range(parallelism)]
        if partitions >= parallelism:
            assert max(per_instance) - min(per_instance) <= 1, (parallelism, owners)
        else:
            assert max(per_instance) == 1, (parallelism, owners)


def test_the_route_sends_a_key_to_its_partitions_routing_key():
    route = PartitionRoute(lambda e: e["k"], lambda: 4, 128, "out")
    keys = routing_keys(4, 128)
    assert [route({"k": k}) for k in ("a", "b", "foobar")] == [keys[kafka_partition(k, 4)] for k in ("a", "b", "foobar")]
    with pytest.raises(TypeError, match="sink 'out': key= of {'k': 3}: a record key is bytes or str, not int"):
        route({"k": 3})


def test_the_c_murmur2_is_the_pythons():
    from driftstream.engine.connectors.kafka.record_batch import NATIVE

    if NATIVE is None:
        pytest.skip("the C accelerators are not built")
    rng = random.Random(9)
    for _ in range(5000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
        assert NATIVE.murmur2(data) == murmur2(data)
    assert {k: NATIVE.murmur2(k) for k in KAFKA_VECTORS} == KAFKA_VECTORS
