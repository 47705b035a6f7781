"""Stable key hashing: which instance owns a key.

Python's ``hash`` of a str is salted per process, so two actors (or a replay)
would disagree on where a key lives. ``stable_hash`` depends on the key's value
only.

>>> stable_hash("apple") == stable_hash("apple")
True
>>> stable_hash(("a", 1)) != stable_hash(("a", 2))
True
>>> stable_hash(7) % 4 == stable_hash(7) % 4
True
"""

from __future__ import annotations

import struct
import zlib
from typing import Any


class UnhashableKeyError(TypeError):
    """A key_by function returned a value with no stable hash."""


def mix32(h: int) -> int:
    """Fibonacci hashing: bits 32-63 of ``h`` times 2**64 / golden ratio, so that every
    output bit depends on the input's bits below it through the product's carries. CRC-32
    is linear, so keys that differ only in a few low bits (``"k0"`` .. ``"k9"``) get CRCs
    that agree on other bits, the ones a key group's owner is read from: at parallelism 2
    every such key went to one instance. O(1), one multiplication (~0.1 µs).

    >>> [mix32(h) % 2 for h in (0x1, 0x2, 0x3, 0x4)]
    [1, 0, 0, 1]
    """
    return ((h * 0x9E3779B97F4A7C15) >> 32) & 0xFFFFFFFF


def mixed_hash(key: Any) -> int:
    """:func:`stable_hash` then :func:`mix32`: what key groups are read from (key hash 2).

    >>> mixed_hash("apple") == mix32(stable_hash("apple"))
    True
    """
    return ((stable_hash(key) * 0x9E3779B97F4A7C15) >> 32) & 0xFFFFFFFF  # mix32, inlined: once per routed element


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that is the same in every process and run.

    Keys may be str, bytes, int, float, bool, None, or tuples of those.
    Cost: O(len(key)) (crc32 of its encoding).
    """
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if t is int or t is bool:
        return zlib.crc32(key.to_bytes(16, "little", signed=True)) if -(2**127) <= key < 2**127 else zlib.crc32(str(key).encode())
    if t is bytes:
        return zlib.crc32(key) ^ 0x5BD1E995
    if key is None:
        return 0x9E3779B1
    if t is float:
        if key.is_integer():  # 1.0 == 1 (and -0.0 == 0): equal keys must meet in one instance
            return stable_hash(int(key))
        return zlib.crc32(struct.pack("<d", key)) ^ 0x27D4EB2F
    if t is tuple:
        h = 0x345678
        for item in key:
            h = zlib.crc32(stable_hash(item).to_bytes(4, "little"), h)
        return h
    raise UnhashableKeyError(
        f"key {key!r} of type {t.__name__} has no stable hash; return a str, bytes, int, float, bool, None or a tuple of those from key_by"
    )
