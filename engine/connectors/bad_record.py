"""BadRecord: what a source's dead letter holds of a record it could not decode.

A dead letter must reach any sink (JSON has no bytes) and must stay small enough to write
(a Kafka topic refuses messages over its ``max.message.bytes``, 1 MiB by default), yet
lose nothing: the record stays where it was read, and its dead letter says where
(topic, partition, offset). Its key and value come as text when they are UTF-8, else
as base64, cut at :data:`MAX_BYTES` each (``value_size`` keeps the original size).
A null value (a tombstone on a compacted topic) is ``value=None``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Optional

#: Bytes of a bad record's key and of its value kept in its dead letter (the rest stays in the source).
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class BadRecord:
    """A record a source could not decode.

    >>> bad_record("orders", 3, 1207, 1700000000000, b"k1", b"\\xff" * 100_000)
    BadRecord(topic='orders', partition=3, offset=1207, timestamp=1700000000000, key='azE=', value='////...', encoding='base64', value_size=100000, truncated=True)
    """

    topic: str
    partition: int
    offset: int
    timestamp: Optional[int]
    key: Optional[str]
    value: Optional[str]
    #: how ``key`` and ``value`` are written: "utf-8" (as they were) or "base64"
    encoding: str
    #: the value's size in bytes in the source (-1: a null value)
    value_size: int
    #: True if the key or the value was cut at MAX_BYTES
    truncated: bool

    def __repr__(self) -> str:
        value = self.value if self.value is None or len(self.value) <= 8 else self.value[:4] + "..."
        return (f"BadRecord(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, timestamp={self.timestamp}, "
                f"key={self.key!r}, value={value!r}, encoding={self.encoding!r}, value_size={self.value_size}, truncated={self.truncated})")


def bad_record(topic: str, partition: int, offset: int, timestamp: Optional[int], key: Optional[bytes], value: Optional[bytes]) -> BadRecord:
    """The :class:`BadRecord` of a raw record. O(size kept)."""
    parts = [b if b is None else b[:MAX_BYTES] for b in (key, value)]
    truncated = any(b is not None and len(b) > MAX_BYTES for b in (key, value))
    try:
        texts = [b if b is None else b.decode("utf-8") for b in parts]
        encoding = "utf-8"
    except UnicodeDecodeError:
        texts = [b if b is None else base64.b64encode(b).decode("ascii") for b in parts]
        encoding = "base64"
    return BadRecord(topic, partition, offset, timestamp, texts[0], texts[1], encoding, -1 if value is None else len(value), truncated)
