"""One Kafka partition's writer of a KafkaSink, and how sink records are encoded: the payload,
its Meta in the ``driftstream-t`` header (:func:`sink_records`, :func:`meta_of`).

Apart from :mod:`.sink` so that the keyed sink's writer (:mod:`.keyed_sink`), which the sink
opens, builds on it without an import circle.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator, Optional

import orjson
from kafka import TopicPartition
from kafka import errors as kafka_errors

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.json_payloads import ORJSON_OPTIONS, json_bytes
from driftstream.engine.model.connectors import SinkPartition
from driftstream.ordering.meta import Meta, meta_from_json

from driftstream.engine.model.errors import short_repr
from driftstream.engine.connectors.kafka.io import LastRecordTimeout, consumer, last_record
from driftstream.engine.connectors.kafka.record_batch import NATIVE
from driftstream.engine.connectors.kafka.security import REFUSED
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from driftstream.engine.connectors.retrying_writer import RetryingWriter, RetryPolicy, WriteErrors

META_HEADER = "driftstream-t"

#: A write the broker failed (unreachable, no leader, a read-back too slow) is retried;
#: refused credentials or a certificate are not: no retry fixes them.
WRITE_ERRORS = WriteErrors(transient=(kafka_errors.KafkaError, OSError), refused=REFUSED,
                           failure=kafka_errors.KafkaConnectionError, setting="KafkaSink retry_s")


class KafkaSinkPartition(SinkPartition):
    """One partition's writer: each bundle becomes record batches sent as produce
    requests (acks=all) one after the other, each awaited (:class:`.PartitionWriter`).

    Not KafkaProducer: its per-record ``send()`` (future, accumulator lock, wake-ups of
    its I/O thread) cost ~55 µs a record and its ``flush()`` ~1.5 ms a bundle, most
    of a sink's CPU; a batch built in one pass costs ~16 µs a record. A failed request
    may have landed: the sinks' one retrying write policy (:class:`.RetryingWriter`) reads
    the partition's last message back before a retry (this writer is the partition's only
    one), and only the rest is written again.
    """

    def __init__(self, sink: "KafkaSink", partition: int) -> None:
        self.sink = sink
        self.partition = partition
        self.writer = PartitionWriter(sink.bootstrap_servers, sink.topic, partition, client_id=f"driftstream-sink-{sink.name}-{partition}",
                                      security=sink.security, compression_type=sink.compression_type)
        self.retrying = RetryingWriter(sink.name, f"{sink.topic}[{partition}]", RetryPolicy(sink.retry_s), WRITE_ERRORS)

    def write(self, bundle: Bundle) -> None:
        records = list(self._records(bundle))  # an element that cannot be encoded fails at once
        self.retrying.write(bundle, records, self._send, lambda timeout_s: self.t_last(timeout_s=timeout_s))

    def _send(self, bundle: Bundle, records: list) -> None:
        self.writer.write(records)

    def _records(self, bundle: Bundle) -> Iterator[tuple]:
        return sink_records(bundle.elements, self.sink.encode, self.sink.name)

    def t_last(self, timeout_s: Optional[float] = None) -> Optional[Meta]:
        """The Meta of the partition's last message (None: the partition is empty), read back
        however slowly the broker answers, for up to ``timeout_s`` (default ``retry_s``): past it
        :class:`.LastRecordTimeout`, never None, which would have the replay write it all again."""
        c = consumer(self.sink.bootstrap_servers, self.sink.security)
        try:
            rec = last_record(c, TopicPartition(self.sink.topic, self.partition), timeout_s=timeout_s or self.sink.retry_s)
        except LastRecordTimeout as exc:
            raise LastRecordTimeout(
                f"sink {self.sink.name!r} cannot tell what {self.sink.topic}[{self.partition}] already holds, so it does not "
                f"write (KafkaSink retry_s={self.sink.retry_s:g}): {exc.args[0]}") from exc
        finally:
            c.close()
        return None if rec is None else meta_of(rec)

    def close(self) -> None:
        self.writer.close()


def sink_records(elements: Iterable[tuple], encode: Callable[[Any], bytes] = json_bytes, sink_name: str = "") -> list:
    """``(value, headers)`` of each ``(meta, payload)`` as a KafkaSink writes it: the payload
    encoded, its Meta in the ``driftstream-t`` header. TypeError naming the sink and the
    element if ``encode`` fails.

    A list is encoded in C where it is built (``_record_batch.c``: 2.4 -> 0.7 us a record of
    the index, with its batch);
    :func:`python_sink_records` is the reference, and says what failed when the C raises.

    >>> sink_records([((5, 0, 1, 5, (2,), False), {"w": "a"})])
    [(b'{"w":"a"}', [('driftstream-t', b'[5,0,1,5,[2],false]')])]
    """
    if NATIVE is not None and type(elements) is list:  # the C consumes it: a generator could not go to the Python after
        try:
            return NATIVE.sink_records(elements, encode, json_bytes, orjson.dumps if encode is json_bytes else None,
                                        ORJSON_OPTIONS, META_HEADER)
        except Exception:  # noqa: BLE001 - the Python raises it again, naming the element
            pass
    return list(python_sink_records(elements, encode, sink_name))


def python_sink_records(elements: Iterable[tuple], encode: Callable[[Any], bytes] = json_bytes, sink_name: str = "") -> Iterator[tuple]:
    """:func:`sink_records` in Python: the reference, and the path of any element the C refuses."""
    for meta, payload in elements:
        try:
            value = encode(payload)
        except Exception as exc:
            raise TypeError(f"sink {sink_name!r} cannot encode {short_repr(payload)} at t={meta!r}: {exc}") from exc
        yield value, [(META_HEADER, json_bytes(meta))]  # a tuple is a JSON array: 1.0 -> 0.3 us


def meta_of(rec: Any) -> Optional[Meta]:
    """The Meta a sink record carries in its header (None for a record without one)."""
    for k, v in rec.headers or ():
        if k == META_HEADER:
            return meta_from_json(json.loads(v))
    return None
