"""Small kafka-python helpers shared by the Kafka source, the Kafka sink and the tests.

kafka-python is 3.x. Brokers differ in how exactly they report a partition's end
offset (Tansu reports the base offset of the last batch + 1), so "the end" is
found by reading from just before the reported end up to the high watermark of
the fetch answers: one record on Apache Kafka, at most one batch on Tansu.

Every helper that opens a client takes the connector's :class:`.KafkaSecurity`.
"""

from __future__ import annotations

import time
from typing import Optional

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaTimeoutError, TopicAlreadyExistsError

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


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int, security: KafkaSecurity = PLAINTEXT,
                 bootstrap_timeout_s: float = 30.0) -> int:
    """Create ``topic`` with ``partitions`` partitions unless it exists; returns its partition count.
    ``bootstrap_timeout_s``: how long its clients try to reach a broker at first."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, bootstrap_timeout_ms=int(bootstrap_timeout_s * 1000),
                             **security.client_settings())
    try:
        if topic not in admin.list_topics():
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    return partition_count(bootstrap_servers, topic, security=security, bootstrap_timeout_s=bootstrap_timeout_s)


def partition_count(bootstrap_servers: str, topic: str, timeout: float = 10.0, security: KafkaSecurity = PLAINTEXT,
                    bootstrap_timeout_s: float = 30.0) -> int:
    """Number of partitions of ``topic`` (0 if it does not exist). ``bootstrap_timeout_s``: how
    long its client tries to reach a broker at first (kafka-python's KafkaTimeoutError then)."""
    c = consumer(bootstrap_servers, security, bootstrap_timeout_ms=int(bootstrap_timeout_s * 1000))
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


class LastRecordTimeout(KafkaTimeoutError):
    """A partition's last record was not read back within the deadline. Slow is not empty:
    a caller that took this for an empty partition would write its output again."""


def last_record(c: KafkaConsumer, tp: TopicPartition, timeout_s: float = 30.0) -> Optional[object]:
    """The last data record of ``tp``, or None if it has none (end offset 0, or only control
    batches). Reads from just before the reported end up to the high watermark of the fetch
    answers (not until reads come back empty: that wait cost 300 ms of every recovery of a
    Kafka sink), however long the answers take; a partition whose last batches hold no data
    record (a transaction's marker) is read back further, 1, 16, 256... offsets before the
    end. :class:`LastRecordTimeout`, saying how far it got, if that takes over ``timeout_s``.
    A live partition's end moves: any end seen is as good as another."""
    deadline = time.monotonic() + timeout_s
    try:
        reported_end = c.end_offsets([tp], timeout_ms=max(1, int(timeout_s * 1000)))[tp]
    except KafkaTimeoutError as exc:
        raise _timed_out(c, tp, timeout_s, f"its end offset was not answered ({exc})") from exc
    if reported_end == 0:
        return None
    c.assign([tp])
    back = 1
    while True:
        start = max(0, reported_end - back)
        last = _last_from(c, tp, start, reported_end, deadline, timeout_s)
        if last is not None or start == 0:
            return last
        back *= 16


def _last_from(c: KafkaConsumer, tp: TopicPartition, start: int, reported_end: int, deadline: float, timeout_s: float) -> Optional[object]:
    """The last data record of ``tp`` from ``start`` on: read until the consumer's position
    reaches the high watermark of a fetch answer (None: no data record in between)."""
    c.seek(tp, start)
    last = None
    while True:
        got = c.poll(timeout_ms=50).get(tp, [])
        if got:
            last = got[-1]
        high, position = c.highwater(tp), c.position(tp, timeout_ms=0)
        # A mark below the reported end is an earlier read's of this consumer (marks only grow).
        # The position passes control batches too: at the mark, nothing is left to read.
        if high is not None and high >= reported_end and position is not None and position >= high:
            # Tansu's mark is its last batch's base offset + 1, and a poll returns at most
            # max_poll_records of a batch: the rest is buffered already, returned at once.
            while more := c.poll(timeout_ms=0).get(tp, []):
                last = more[-1]
            return last
        if time.monotonic() > deadline:
            seen = ("no fetch answer came" if high is None or high < reported_end
                    else f"fetch answers reached offset {position} of the high watermark {high}")
            raise _timed_out(c, tp, timeout_s, f"reading from offset {start} (end offset {reported_end}), {seen}")


def _timed_out(c: KafkaConsumer, tp: TopicPartition, timeout_s: float, what: str) -> LastRecordTimeout:
    return LastRecordTimeout(
        f"the last record of {tp.topic}[{tp.partition}] was not read back from {c.config['bootstrap_servers']} within "
        f"{timeout_s:g} s: {what}. A slow broker is not an empty partition: check that the broker is up and answers "
        f"fetches in time (its load, the network to it), then run again")


def true_end(c: KafkaConsumer, tp: TopicPartition, timeout_s: float = 30.0) -> int:
    """The offset after the last record of ``tp`` (0 for an empty partition)."""
    rec = last_record(c, tp, timeout_s)
    return 0 if rec is None else rec.offset + 1


def topic_end(c: KafkaConsumer, topic: str, partitions: int) -> int:
    """The sum of the true ends of ``topic``'s ``partitions`` first partitions: the records a
    non-transactional writer put there, counted without reading them all."""
    return sum(true_end(c, TopicPartition(topic, p)) for p in range(partitions))
