"""Kafka's default partitioner for keyed records, and how a keyed sink's input is routed.

A record with a key goes to partition ``toPositive(murmur2(key)) % partitions`` in Kafka's
Java producer (``Utils.murmur2``, seed ``0x9747b28c``), Kafka Streams, Flink's ``KafkaSink``
with a key serializer and librdkafka's ``murmur2_random``: :func:`kafka_partition` is that
function, bit for bit (signed 32-bit arithmetic, as Java's). A consumer reading a topic as a
changelog (a KTable, upsert-kafka, a compacted topic) relies on a key staying in one partition.

>>> murmur2(b"21"), murmur2(b"foobar"), murmur2(b"abc")   # Kafka's UtilsTest vectors
(-973932308, -790332482, 479470107)
>>> kafka_partition(b"foobar", 4), kafka_partition("foobar", 4)
(2, 2)

:class:`PartitionRoute` is the ``key_by`` function a keyed :class:`.KafkaSink` puts before its
barriers: it sends every element of Kafka partition ``p`` to the one instance that writes
``p``, whatever the parallelism.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Optional

from driftstream.engine.model.errors import short_repr
from driftstream.ordering.key_groups import KeyGroups

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``: a signed 32-bit int, as Java returns it. O(len).

    >>> murmur2(b""), murmur2(b"a-little-bit-long-string"), murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8")
    (275646681, -985981536, -58897971)
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    # Java's int products wrap at 32 bits: masking after each product gives the same low bits.
    for (k,) in _WORDS.iter_unpack(data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[whole + 2] << 16
        if rest >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _fast_murmur2() -> Callable[[bytes], int]:
    """The C :func:`murmur2` (``_record_batch.c``, ~0.04 µs a short key against ~1 µs), or this one."""
    from driftstream.engine.connectors.kafka.record_batch import NATIVE

    return getattr(NATIVE, "murmur2", None) or murmur2


#: :func:`murmur2`, in C where it is built: what the keyed sink's routing and writing hash with
fast_murmur2 = _fast_murmur2()


def key_bytes(key: Any) -> bytes:
    """A record key as bytes: bytes as they are, a str in UTF-8; TypeError otherwise.

    >>> key_bytes("é"), key_bytes(b"k")
    (b'\\xc3\\xa9', b'k')
    """
    t = type(key)
    if t is bytes:
        return key
    if t is str:
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a record key is bytes or str, not {type(key).__name__} ({short_repr(key)}): return key.encode() or str(key) from key=")


def kafka_partition(key: Any, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (bytes or str) among ``partitions``:
    ``(murmur2(key) & 0x7fffffff) % partitions`` (Java's ``Utils.toPositive``)."""
    return (murmur2(key_bytes(key)) & 0x7FFFFFFF) % partitions


def routing_keys(partitions: int, max_parallelism: int, tries: int = 1024) -> list:
    """Per Kafka partition ``p``, a ``key_by`` key whose key group is (as near as ``tries``
    candidates find) the middle of ``p``'s share of the groups, ``(2p+1)·m / 2P``: an
    instance owns a contiguous range of groups, so at any parallelism the partitions spread
    over the instances as evenly as whole partitions can (4 partitions: 2+2 at 2, 1+2+1 at 3).
    Routing by ``p`` itself would leave that to the hash (two instances could get all four).
    Deterministic; O(partitions · tries) hashes, once per process.

    >>> groups = KeyGroups(128)
    >>> [groups.owner(groups.group_of(k), 3) for k in routing_keys(4, 128)]
    [0, 1, 1, 2]
    """
    groups = KeyGroups(max_parallelism)
    keys = []
    for p in range(partitions):
        target = (2 * p + 1) * max_parallelism // (2 * partitions)
        best, off = p, max_parallelism
        for s in range(tries):
            candidate = p + s * partitions  # distinct across partitions
            d = abs(groups.group_of(candidate) - target)
            if d < off:
                best, off = candidate, d
                if d == 0:
                    break
        keys.append(best)
    return keys


class PartitionRoute:
    """The ``key_by`` function before a keyed sink: element -> the routing key of the Kafka
    partition its key goes to (:func:`kafka_partition`). ``key``: the sink's ``key=``;
    ``partitions``: called once per process for the topic's partition count (fixed for a run).
    Errors name ``sink``. O(len(key)) an element after the first call."""

    def __init__(self, key: Callable[[Any], Any], partitions: Callable[[], int], max_parallelism: int, sink: str) -> None:
        self.key = key
        self.partitions = partitions
        self.max_parallelism = max_parallelism
        self.sink = sink
        self._keys: Optional[list] = None

    def __call__(self, element: Any) -> int:
        keys = self._keys
        if keys is None:
            keys = self._keys = routing_keys(self.partitions(), self.max_parallelism)
        return keys[partition_of(self.key, element, len(keys), self.sink)]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_keys": None}  # recomputed where it runs: cheaper than shipping


def partition_of(key: Callable[[Any], Any], element: Any, partitions: int, sink: str) -> int:
    """The Kafka partition of ``element`` under ``key``; TypeError naming ``sink`` and the element."""
    try:
        return (fast_murmur2(key_bytes(key(element))) & 0x7FFFFFFF) % partitions
    except TypeError as exc:
        raise TypeError(f"sink {sink!r}: key= of {short_repr(element)}: {exc}") from exc
