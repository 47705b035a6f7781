"""KafkaSink: barrier ``i`` writes partition ``i`` of the topic, in t order, Meta in a header.

Because every message carries its Meta (header ``driftstream-t``, JSON) and a
partition is written by one barrier in Meta order, the sink's last bundle is
the Meta of the partition's last message: after a failure, a replay drops
everything at or before it, and a bundle that was only partly written is still
exact.

>>> flow.source(src).map(f).sink(KafkaSink("out", "127.0.0.1:9092"))   # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from kafka import KafkaProducer, TopicPartition

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.sink import Sink, SinkPartition
from driftstream.ordering.meta import Meta, meta_from_json

from .errors import short_repr
from .kafka_io import consumer, ensure_topic, last_record, read_partition

META_HEADER = "driftstream-t"


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class KafkaSink(Sink):
    """Write released elements to ``topic`` (created with one partition per barrier if missing).

    ``encode``: payload -> bytes (default: compact JSON).
    """

    def __init__(self, topic: str, bootstrap_servers: str, name: Optional[str] = None, encode: Callable[[Any], bytes] = _json_bytes) -> None:
        super().__init__(name or topic.replace("/", "_"))
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.encode = encode

    def open(self, partition: int, partitions: int) -> SinkPartition:
        have = ensure_topic(self.bootstrap_servers, self.topic, partitions)
        if have < partitions:
            raise ValueError(
                f"sink topic {self.topic!r} has {have} partitions but the flow writes {partitions}: "
                "create it with at least as many partitions as the sink's parallelism"
            )
        return _KafkaSinkPartition(self, partition)


class _KafkaSinkPartition(SinkPartition):
    def __init__(self, sink: KafkaSink, partition: int) -> None:
        self.sink = sink
        self.partition = partition
        # One request in flight keeps the partition in the order we send. The flush at the
        # end of each bundle sends it: a long linger and large batches spare the producer
        # a wake-up of its network thread per record (about a third of its CPU cost).
        self.producer = KafkaProducer(
            bootstrap_servers=sink.bootstrap_servers,
            acks="all",
            linger_ms=1000,
            batch_size=1 << 20,
            max_in_flight_requests_per_connection=1,
        )

    def write(self, bundle: Bundle) -> None:
        send, topic, p, encode = self.producer.send, self.sink.topic, self.partition, self.sink.encode
        for meta, payload in bundle.elements:
            try:
                value = encode(payload)
            except Exception as exc:
                raise TypeError(f"sink {self.sink.name!r} cannot encode {short_repr(payload)} at t={meta!r}: {exc}") from exc
            send(topic, value=value, partition=p, headers=[(META_HEADER, _json_bytes(Meta._make(meta).to_json()))])
        self.producer.flush()  # returns once the broker has every message: the bundle's ack

    def last_bundle(self) -> Optional[Meta]:
        c = consumer(self.sink.bootstrap_servers)
        try:
            rec = last_record(c, TopicPartition(self.sink.topic, self.partition))
        finally:
            c.close()
        return None if rec is None else _meta_of(rec)

    def close(self) -> None:
        self.producer.close()


def _meta_of(rec: Any) -> Optional[Meta]:
    for k, v in rec.headers or ():
        if k == META_HEADER:
            return meta_from_json(json.loads(v))
    return None


def read_kafka_sink(bootstrap_servers: str, topic: str, decode: Callable[[bytes], Any] = json.loads) -> list:
    """Every message of a sink topic as ``(Meta, value)``, merged across partitions in t order."""
    from .kafka_io import partition_count

    c = consumer(bootstrap_servers)
    out: list = []
    try:
        for p in range(partition_count(bootstrap_servers, topic)):
            out.extend((_meta_of(r), decode(r.value)) for r in read_partition(c, TopicPartition(topic, p), 0))
    finally:
        c.close()
    out.sort(key=lambda e: e[0])
    return out
