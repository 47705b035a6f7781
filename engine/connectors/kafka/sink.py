"""KafkaSink: barrier ``i`` writes partition ``i`` of the topic, in t order, Meta in a header.

Because every message carries its Meta (header ``driftstream-t``, JSON) and a
partition is written by one barrier in Meta order, the sink's last bundle is
the Meta of the partition's last message: after a failure, a replay drops
everything at or before it, and a bundle that was only partly written is still
exact.

>>> flow.source(src).map(f).sink(KafkaSink("out", "127.0.0.1:9092"))   # doctest: +SKIP
>>> KafkaSink("out", "127.0.0.1:9092", compression="zstd")             # doctest: +SKIP

A secured broker: ``security=KafkaSecurity(...)`` or kafka-python's settings as keyword
arguments, as for :class:`.KafkaSource`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import orjson
from kafka import TopicPartition
from kafka import errors as kafka_errors

from driftstream.barriers.bundle import Bundle
from driftstream.engine.model.connectors import Sink, SinkPartition
from driftstream.ordering.meta import Meta, meta_from_json

from driftstream.engine.model.errors import FlowError, short_repr
from driftstream.barriers.json_payloads import ORJSON_OPTIONS, json_bytes
from driftstream.engine.connectors.kafka.codecs import compression_type
from driftstream.engine.connectors.kafka.record_batch import NATIVE
from driftstream.engine.connectors.kafka.io import LastRecordTimeout, consumer, ensure_topic, last_record, read_partition
from driftstream.engine.connectors.kafka.schema_registry import FORMATS as REGISTRY_FORMATS
from driftstream.engine.connectors.kafka.schema_registry import RegistryEncoder, SchemaRegistry, check_format, registry_of
from driftstream.engine.connectors.kafka.security import PLAINTEXT, REFUSED, KafkaSecurity, security_of
from driftstream.engine.connectors.kafka.reach import bootstrap_errors, reach
from driftstream.engine.connectors.kafka.wire import CHECK_TIMEOUT_S, check_broker
from driftstream.engine.connectors.kafka.sink_partition import (  # noqa: F401 - the sink's record format, re-exported
    META_HEADER, KafkaSinkPartition, meta_of, python_sink_records, sink_records)

log = logging.getLogger(__name__)



class KafkaSink(Sink):
    """Write released elements to ``topic`` (created with one partition per barrier if missing).

    ``encode``: payload -> bytes (default: compact JSON). ``retry_s``: how long a write the
    broker fails (unreachable, no leader) is retried, with backoff, before the run fails
    with the error; a retry first reads the partition's last message back and writes only
    what did not land, so nothing is written twice. ``security`` (or kafka-python's security
    settings as keyword arguments): TLS and SASL, see :class:`.KafkaSecurity`.
    ``compression``: ``None`` (default), ``"gzip"``, ``"snappy"``, ``"lz4"`` or ``"zstd"``: the
    codec of the record batches written (any Kafka consumer reads them). On the inverted
    index's output, snappy, lz4 and zstd add under 1 µs a record to the sink's ~5 µs of
    encoding and save 74-85% of the bytes; gzip (level 9) adds 2-7 µs for 83-86%
    (``driftstream bench kafka-codecs``, ``examples/inverted_index/results/README.md``).
    ``create_partitions``: how many partitions a missing topic is created with (default: one
    per instance of the sink's stage; more lets the flow rescale up to that many).
    ``key``: element -> its record key (bytes or str). The record then goes to the partition
    Kafka's default partitioner gives the key (murmur2, :mod:`.partitioner`), at any
    parallelism and across rescales, so a changelog reader (a KTable, upsert-kafka, a compacted
    topic) sees each key's records in one partition, in t order. The flow routes the sink's
    input by that partition (a shuffle before the sink), so each partition has one writer
    (:mod:`.keyed_sink`); the topic may have more or fewer partitions than the parallelism.
    The partition count is read once per run: add partitions to the topic only while the
    flow is stopped (as in Kafka, that moves keys to other partitions).

    >>> KafkaSink("counts", "127.0.0.1:9092", key=lambda c: c["word"])   # doctest: +SKIP
    """

    def __init__(self, topic: str, bootstrap_servers: str, name: Optional[str] = None, encode: Callable[[Any], bytes] = json_bytes,
                 retry_s: float = 60.0, security: Optional[KafkaSecurity] = None, compression: Optional[str] = None,
                 create_partitions: Optional[int] = None, value_format: Optional[str] = None, schema: Optional[str] = None,
                 schema_registry: Union[str, SchemaRegistry, None] = None, subject_name_strategy: str = "topic",
                 protobuf_message: Optional[type] = None, key: Optional[Callable[[Any], Any]] = None, **security_settings: Any) -> None:
        super().__init__(name or topic.replace("/", "_"))
        if key is not None and not callable(key):
            raise FlowError(f"KafkaSink({topic!r}) key= takes a function of the element returning bytes or str, not {short_repr(key)}")
        if value_format is not None:
            what = f"KafkaSink({topic!r})"
            if value_format not in REGISTRY_FORMATS:
                raise FlowError(f"{what} value_format is one of {', '.join(map(repr, REGISTRY_FORMATS))} (or None: encode=, JSON by default), "
                                f"not {value_format!r}")
            if encode is not json_bytes:
                raise FlowError(f"{what}: give value_format= or encode=, not both")
            check_format(value_format, what, schema, protobuf_message, writing=True)
            encode = RegistryEncoder(value_format, registry_of(schema_registry, what), topic, schema, subject_name_strategy, protobuf_message)
        self.compression = compression
        self.compression_type = compression_type(compression, topic)  # an unknown or missing codec fails here, on the driver
        self.security = security_of(security, security_settings)
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.encode = encode
        self.retry_s = retry_s
        self.create_partitions = create_partitions
        self.key = key
        #: a keyed sink's topic partition count, fixed for a run once :meth:`check` read it
        self.topic_partitions: Optional[int] = None

    def open(self, partition: int, partitions: int) -> SinkPartition:
        self.check(partitions)
        if self.key is not None:
            from driftstream.engine.connectors.kafka.keyed_sink import KeyedKafkaSinkPartition

            return KeyedKafkaSinkPartition(self)
        return KafkaSinkPartition(self, partition)

    def partition_key(self, max_parallelism: int) -> Optional[Callable[[Any], Any]]:
        """With ``key=``: the ``key_by`` function that sends every element of a Kafka partition to
        the one instance writing it (:class:`.PartitionRoute`); None otherwise."""
        if self.key is None:
            return None
        from driftstream.engine.connectors.kafka.partitioner import PartitionRoute

        return PartitionRoute(self.key, self.partition_count, max_parallelism, self.name)

    def partition_count(self) -> int:
        """The topic's partition count for this run: what :meth:`check` read (the driver checks
        before the actors start, and they get it with the flow), else asked now."""
        if self.topic_partitions is None:
            from driftstream.engine.connectors.kafka.io import partition_count

            have = partition_count(self.bootstrap_servers, self.topic, security=self.security)
            if have < 1:
                raise ValueError(f"sink {self.name!r}: topic {self.topic!r} does not exist on {self.bootstrap_servers}: create it, "
                                 "or let the run create it (KafkaSink create_partitions=)")
            self.topic_partitions = have
        return self.topic_partitions

    def check(self, partitions: int) -> None:
        """The topic (created with ``partitions`` partitions if missing) must have at least
        ``partitions``: each barrier writes its own partition, the only writer of it, so that
        its last message is the barrier's ``t_last``. A keyed sink's partitions are each
        written by one instance whatever their number: any count does."""
        who = f"KafkaSink {self.name!r} (topic {self.topic!r})"
        reach(self.bootstrap_servers, who, self.retry_s)  # within retry_s, naming the sink, not kafka-python's bare timeout
        check_broker(self.bootstrap_servers, self.security, min(CHECK_TIMEOUT_S, self.retry_s))
        with bootstrap_errors(self.bootstrap_servers, who, self.retry_s):
            have = ensure_topic(self.bootstrap_servers, self.topic, max(partitions, self.create_partitions or 0), self.security,
                                bootstrap_timeout_s=self.retry_s)
        if self.key is not None:
            if self.topic_partitions is None:  # fixed for the run: routing and writing must agree
                self.topic_partitions = have
            return
        if have < partitions:
            raise ValueError(
                f"sink topic {self.topic!r} has {have} partitions but the flow writes {partitions} (one per instance of the "
                f"sink's stage): add partitions to the topic (kafka-topics.sh --alter --partitions {partitions}), or run at "
                f"parallelism {have} or less"
            )

    def __repr__(self) -> str:
        codec = f", compression={self.compression!r}" if self.compression else ""
        return f"KafkaSink({self.topic!r}, {self.bootstrap_servers!r}{codec}, security={self.security!r})"


def read_kafka_sink(bootstrap_servers: str, topic: str, decode: Callable[[bytes], Any] = json.loads, security: KafkaSecurity = PLAINTEXT) -> list:
    """Every message of a sink topic as ``(Meta, value)``, merged across partitions in t order."""
    from driftstream.engine.connectors.kafka.io import partition_count

    c = consumer(bootstrap_servers, security)
    out: list = []
    try:
        parts = [TopicPartition(topic, p) for p in range(partition_count(bootstrap_servers, topic, security=security))]
        ends = c.end_offsets(parts) if parts else {}
        for tp in parts:
            if ends.get(tp):  # an empty partition would cost read_partition's idle wait
                out.extend((meta_of(r), decode(r.value)) for r in read_partition(c, tp, 0))
    finally:
        c.close()
    out.sort(key=lambda e: e[0])
    return out
