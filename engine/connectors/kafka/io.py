"""Small kafka-python helpers shared by the Kafka source, the Kafka sink and the tests.

kafka-python is 3.x. Brokers differ in how exactly they report a partition's end
offset (Tansu reports the base offset of the last batch + 1), so "the end" is
found by reading from just before the reported end until nothing more comes:
one record on Apache Kafka, at most one batch on Tansu.

Every helper that opens a client takes the connector's :class:`.KafkaSecurity`.
"""

from __future__ import annotations

import time
from typing import Optional

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from driftstream.engine.connectors.kafka.security import PLAINTEXT, KafkaSecurity


def consumer(bootstrap_servers: str, security: KafkaSecurity = PLAINTEXT, **kw) -> KafkaConsumer:
    """A consumer with no group and no auto-commit: driftstream tracks offsets itself.

    Its fetches wait at most 100 ms for records (kafka-python: 500): a helper that reads on
    after :func:`last_record` (a seek elsewhere) would otherwise wait that long for the
    long poll still out at the end before its own fetch goes out.
    """
    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **{"group_id": None, "fetch_max_wait_ms": 100, **kw},
        **security.client_settings(),
    )


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int, security: KafkaSecurity = PLAINTEXT) -> int:
    """Create ``topic`` with ``partitions`` partitions unless it exists; returns its partition count."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **security.client_settings())
    try:
        if topic not in admin.list_topics():
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    return partition_count(bootstrap_servers, topic, security=security)


def partition_count(bootstrap_servers: str, topic: str, timeout: float = 10.0, security: KafkaSecurity = PLAINTEXT) -> int:
    """Number of partitions of ``topic`` (0 if it does not exist)."""
    c = consumer(bootstrap_servers, security)
    try:
        deadline = time.time() + timeout
        while True:
            parts = c.partitions_for_topic(topic)
            if parts or time.time() > deadline:
                return len(parts or ())
            time.sleep(0.05)
    finally:
        c.close()


def read_partition(c: KafkaConsumer, tp: TopicPartition, start: int, idle_ms: int = 300, max_s: Optional[float] = None) -> list:
    """All records of ``tp`` from offset ``start`` to the end (until ``idle_ms`` pass with nothing
    new). A partition still being written never goes idle: ``max_s`` bounds the read then."""
    c.assign([tp])
    c.seek(tp, start)
    out: list = []
    idle_since = began = time.time()
    while (time.time() - idle_since) * 1000 < idle_ms and (max_s is None or time.time() - began < max_s):
        got = c.poll(timeout_ms=50).get(tp, [])
        if got:
            out.extend(got)
            idle_since = time.time()
    return out


def last_record(c: KafkaConsumer, tp: TopicPartition, max_s: float = 1.0) -> Optional[object]:
    """The last record of ``tp``, or None if it is empty: read from just before the reported
    end up to the high watermark of the fetch answers (not until reads come back empty: that
    wait cost 300 ms of every recovery of a Kafka sink). A live partition's end moves: any
    end seen within ``max_s`` is as good as another."""
    reported_end = c.end_offsets([tp])[tp]
    if reported_end == 0:
        return None
    c.assign([tp])
    c.seek(tp, max(0, reported_end - 1))
    last, began = None, time.time()
    while time.time() - began < max_s:
        got = c.poll(timeout_ms=50).get(tp, [])
        if got:
            last = got[-1]
        high = c.highwater(tp)
        if last is not None and high is not None and last.offset + 1 >= high:
            # Tansu's mark is its last batch's base offset + 1, and a poll returns at most
            # max_poll_records of a batch: the rest is buffered already, returned at once.
            while more := c.poll(timeout_ms=0).get(tp, []):
                last = more[-1]
            break
    return last


def true_end(c: KafkaConsumer, tp: TopicPartition) -> int:
    """The offset after the last record of ``tp`` (0 for an empty partition)."""
    rec = last_record(c, tp)
    return 0 if rec is None else rec.offset + 1


def topic_end(c: KafkaConsumer, topic: str, partitions: int) -> int:
    """The sum of the true ends of ``topic``'s ``partitions`` first partitions: the records a
    non-transactional writer put there, counted without reading them all."""
    return sum(true_end(c, TopicPartition(topic, p)) for p in range(partitions))
