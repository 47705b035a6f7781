"""Kafka record batches (magic 2), uncompressed, encoded in one pass.

kafka-python's ``MemoryRecordsBuilder`` appends a record at a time through generic
Python (a varint function call per field, size checks, a buffer that grows): ~5 µs a
record, 18% of a stateful instance's CPU over the inverted index's backlog, whose sink
writes ~50 small records per document. Here a record is a join of byte strings whose
varints come from a table, and the batch's CRC-32C is one C call
(``crc32c``, through kafka-python's ``calc_crc32c``); a list of records is encoded in C
where it is built (``_record_batch.c``, the same bytes). Compressed batches still go
through the builder (the codec's cost dwarfs the encoding's).

>>> from kafka.record.memory_records import MemoryRecords
>>> batch = EncodedBatch.of([(b'{"a": 1}', [("h", b"v")]), (b"x", [])], timestamp_ms=1_700_000_000_000)
>>> decoded = MemoryRecords(batch.buffer()).next_batch()
>>> decoded.validate_crc(), [(r.offset, r.value, r.headers) for r in decoded]
(True, [(0, b'{"a": 1}', [('h', b'v')]), (1, b'x', [])])

Format (KIP-98): ``baseOffset int64, batchLength int32, partitionLeaderEpoch int32,
magic int8, crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64,
maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence int32,
records [length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
key (varint length, -1: null), value, headers]``; the CRC covers everything after it.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

from kafka.record.util import calc_crc32c

from driftstream.ordering.accelerators import accelerator

#: the C batches and a sink's records (:func:`.sink.sink_records`); None: not built, or
#: DRIFTSTREAM_PURE_PYTHON
NATIVE = accelerator("driftstream.engine.connectors.kafka._record_batch")

#: the batch header up to the CRC, then from the attributes to the record count
_HEAD = struct.Struct(">qiib")
_TAIL = struct.Struct(">hiqqqhii")
_CRC = struct.Struct(">I")
#: bytes of the header: baseOffset .. record count
HEADER_BYTES = _HEAD.size + _CRC.size + _TAIL.size


def _zigzag_varint(n: int) -> bytes:
    """Kafka's signed varint: zigzag, then 7 bits a byte, low first.

    >>> [_zigzag_varint(n).hex() for n in (0, -1, 1, 63, 64, 300)]
    ['00', '01', '02', '7e', '8001', 'd804']
    """
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


#: varints of 0 .. 16383: lengths, offset deltas and header counts of ordinary records
_SMALL = [_zigzag_varint(n) for n in range(1 << 14)]


def varint(n: int) -> bytes:
    """:func:`_zigzag_varint`, from a table below 16384. O(1).

    >>> varint(300) == _zigzag_varint(300) and varint(1 << 20) == _zigzag_varint(1 << 20)
    True
    """
    return _SMALL[n] if 0 <= n < 16384 else _zigzag_varint(n)


_NULL_KEY = _zigzag_varint(-1)
#: a record's attributes (0) and timestamp delta (0: every record of a batch has its time)
_ATTRS_AND_TS = b"\x00\x00"


def encode_record(offset_delta: int, value: bytes, headers: Sequence[tuple], key: Optional[bytes] = None) -> bytes:
    """One record: ``key`` (None: a null key), ``value`` and ``headers`` ``[(str, bytes)]``.

    >>> encode_record(0, b"v", []).hex()     # length 7, attributes, ts delta, offset delta, null key, value, no headers
    '0e00000001027600'
    >>> encode_record(0, b"v", [], key=b"k").hex()   # the key: its length (1), then its bytes
    '10000000026b027600'
    """
    k_parts = _NULL_KEY if key is None else varint(len(key)) + key
    parts = [_ATTRS_AND_TS, varint(offset_delta), k_parts, varint(len(value)), value, varint(len(headers))]
    for name, hval in headers:
        k = name.encode()
        parts += (varint(len(k)), k, varint(len(hval)), hval)
    body = b"".join(parts)
    return varint(len(body)) + body


@dataclass
class EncodedBatch:
    """A closed record batch: what :class:`.PartitionWriter` sends (``buffer()``) and how many
    records it holds (``next_offset()``), as kafka-python's builder says them."""

    data: bytes
    count: int

    @classmethod
    def of(cls, records: Sequence[tuple], timestamp_ms: int) -> "EncodedBatch":
        """The batch of ``(value, headers)`` pairs (or ``(value, headers, key)``), every record at ``timestamp_ms``. O(bytes)."""
        return cls.joined([encode_record(i, *record) for i, record in enumerate(records)], timestamp_ms)

    @classmethod
    def joined(cls, encoded: list, timestamp_ms: int) -> "EncodedBatch":
        """The batch of records :func:`encode_record` encoded at offset deltas 0, 1, .."""
        n = len(encoded)
        tail = _TAIL.pack(0, n - 1, timestamp_ms, timestamp_ms, -1, -1, -1, n) + b"".join(encoded)
        head = _HEAD.pack(0, len(tail) + _CRC.size + 5, -1, 2)  # batchLength: from the leader epoch on
        return cls(head + _CRC.pack(calc_crc32c(tail)) + tail, n)

    def buffer(self) -> bytes:
        return self.data

    def next_offset(self) -> int:
        return self.count

    def close(self) -> None:
        """Built already (the builder's protocol)."""


def encoded_batches(records: Iterable[tuple], max_bytes: int, clock=time.time) -> Iterator[EncodedBatch]:
    """``(value, headers)`` pairs (or ``(value, headers, key)``: a keyed record) as batches of
    at most about ``max_bytes`` each (a record larger than that goes alone), every record stamped now.

    A list of records is encoded in C where it is built (``_record_batch.c``);
    :func:`python_batches` is the reference, and raises what the C refuses.

    >>> [b.count for b in encoded_batches([(b"x" * 40, [])] * 5, max_bytes=180)]
    [2, 2, 1]
    """
    now_ms = int(clock() * 1000)
    if NATIVE is not None and type(records) is list:  # the C consumes it: a generator could not go to the Python after
        try:
            batches = NATIVE.encoded_batches(records, max_bytes, now_ms)
        except Exception:  # noqa: BLE001 - the Python raises it again, or encodes what the C does not take
            batches = None
        if batches is not None:
            for data, count in batches:
                yield EncodedBatch(data, count)
            return
    yield from python_batches(records, max_bytes, now_ms)


def python_batches(records: Iterable[tuple], max_bytes: int, now_ms: int) -> Iterator[EncodedBatch]:
    """:func:`encoded_batches` in Python, every record at ``now_ms``: the reference."""
    batch: list = []
    size = HEADER_BYTES
    for parts in records:  # (value, headers) or, a keyed sink's, (value, headers, key)
        record = encode_record(len(batch), *parts)
        if batch and size + len(record) > max_bytes:
            yield EncodedBatch.joined(batch, now_ms)
            batch, size = [], HEADER_BYTES
            record = encode_record(0, *parts)  # its offset delta in the new batch
        batch.append(record)
        size += len(record)
    if batch:
        yield EncodedBatch.joined(batch, now_ms)
