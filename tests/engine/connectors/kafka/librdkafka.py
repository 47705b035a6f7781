"""confluent-kafka (librdkafka, the client of most non-Java producers) as the tests' producer
and consumer: input written and output read by a client no one here wrote.

>>> produce(bs, "docs", [(0, b'{"i": 1}')], compression="zstd")    # doctest: +SKIP
>>> [m.value() for m in consume(bs, "docs", [0])]                  # doctest: +SKIP
[b'{"i": 1}']
"""

from __future__ import annotations

import time
from typing import Optional

from confluent_kafka import Consumer, Producer, TopicPartition

from driftstream.engine.connectors.kafka.codecs import codec_name
from driftstream.engine.connectors.kafka.wire import TopicFetcher

#: librdkafka's log lines (connections closed by the broker, ...) are not the tests' concern.
QUIET = {"log_level": 3}


def producer(bs: str, compression: Optional[str] = None, transactional_id: Optional[str] = None, mock_brokers: int = 0) -> Producer:
    """A librdkafka producer that batches (linger 20 ms), compressing with ``compression``.
    ``mock_brokers``: it starts librdkafka's mock cluster of that many brokers (``bs`` is
    then ignored; ``list_topics().brokers`` gives their addresses), which lives as long as it."""
    conf = {"bootstrap.servers": bs, "linger.ms": 20, "compression.type": compression or "none", **QUIET}
    if mock_brokers:
        conf["test.mock.num.brokers"] = mock_brokers
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
    return Producer(conf)


def produce(bs: str, topic: str, rows: list, compression: Optional[str] = None, headers: Optional[list] = None) -> None:
    """Write ``(partition, value)`` rows, each with ``headers``, and wait until every one landed."""
    p = producer(bs, compression)
    failed: list = []
    for partition, value in rows:
        p.produce(topic, value, partition=partition, headers=headers or [],
                  on_delivery=lambda err, msg: err is not None and failed.append(err))
    assert p.flush(30) == 0 and not failed, failed


def consume(bs: str, topic: str, partitions: list, isolation: str = "read_committed", idle_s: float = 1.0) -> list:
    """Every message of ``partitions`` from offset 0, until none came for ``idle_s``."""
    c = Consumer({"bootstrap.servers": bs, "group.id": "driftstream-tests", "enable.auto.commit": False,
                  "isolation.level": isolation, **QUIET})
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, idle_since = [], time.time()
    try:
        while time.time() - idle_since < idle_s:
            msg = c.poll(0.1)
            if msg is not None and msg.error() is None:
                out.append(msg)
                idle_since = time.time()
    finally:
        c.close()
    return out


def batch_codecs(bs: str, topic: str, partition: int) -> set:
    """The codecs of the data batches of a partition, as stored (first answer's worth)."""
    fetcher = TopicFetcher(bs, topic, [partition], max_wait_ms=100)
    try:
        for _ in range(20):
            answer = fetcher.fetch_answers({partition: 0}, decode=False).get(partition)
            if answer is not None and answer.batches:
                return {codec_name(b.codec) for b in answer.batches if b.marker is None}
        return set()
    finally:
        fetcher.close()
