"""State keys as a stateful step stores them: its key group first, then the key.

Every record of keyed state, in RocksDB and in a delta, is keyed by a 2-byte
big-endian key group followed by :func:`~.codec.encode_key` of the state key. The
records of a range of groups are then one contiguous range of RocksDB keys: an
instance that takes over groups after a change of parallelism seeks to the range
and reads it, never the rest (see :mod:`.slices`).

A step's state key is not always the key its elements were routed by: a window's is
``(key, start, end)``, an entry's ``(key, entry)``. ``routing_key`` maps one to the
other; the group is that key's (:meth:`~driftstream.ordering.key_groups.KeyGroups.group_of`).

>>> from driftstream.ordering.key_groups import KeyGroups
>>> keys = StateKeys(KeyGroups(128), routing_key=first)
>>> raw = keys.encode(("apple", 0, 60000))
>>> keys.group(raw) == KeyGroups(128).group_of("apple"), keys.decode(raw)
(True, ('apple', 0, 60000))
>>> lo, hi = StateKeys.bounds(GroupRange(3, 5)); lo, hi
(b'\\x00\\x03', b'\\x00\\x05')

Snapshots written before key groups (manifest version 1, delta format 3 and
older) keyed records by ``encode_key`` alone; :meth:`StateKeys.from_legacy` gives
such a key its group prefix, so an old snapshot restores at any parallelism too.

Costs: :meth:`encode` is the stable hash of the routing key (a crc32) plus
``encode_key``, well under the microseconds of the RocksDB call it precedes;
:meth:`group` and :meth:`bounds` are O(1).
"""

from __future__ import annotations

import functools
import struct
from operator import itemgetter
from typing import Any, Callable, Hashable, Optional

from driftstream.ordering.key_groups import GroupRange, KeyGroups

from .codec import decode, encode_key, encode_keys, encode_pairs, pair_start

_GROUP = struct.Struct(">H")

#: Bytes of the key-group prefix of every stored state key.
PREFIX_BYTES = _GROUP.size

#: Routing keys whose packed start :meth:`StateKeys.encode_many` keeps.
STARTS_KEPT = 1 << 16

#: The routing key of a state key of windows ``(key, start, end)`` and of entries ``(key, entry)``.
first = itemgetter(0)


class StateKeys:
    """How one step's state keys are laid out: ``group`` (2 bytes) + ``encode_key(key)``.

    ``routing_key(state key)``: the key the step's elements were routed by (None: the
    state key itself).
    """

    __slots__ = ("key_groups", "routing_key", "_group_of", "_starts")

    def __init__(self, key_groups: Optional[KeyGroups] = None, routing_key: Optional[Callable[[Hashable], Any]] = None) -> None:
        self.key_groups = key_groups or KeyGroups()
        self.routing_key = routing_key
        group_of = self.key_groups.group_of
        if routing_key is None:
            self._group_of = group_of
        else:
            # the groups of the last 65,536 routing keys: a word's entries (a key's windows)
            # share one, and a base encodes a key per entry (a crc32 each: 0.6 us of 2.5)
            recent = functools.lru_cache(maxsize=1 << 16)(group_of)
            self._group_of = lambda key: recent(routing_key(key))
        # Entries route by their first item: a base's keys of one word share its group and
        # its packed form (up to STARTS_KEPT words, then forgotten at once: a dict's get is
        # half an lru_cache's call).
        self._starts: Optional[dict] = {} if routing_key is first else None

    def group_of(self, key: Hashable) -> int:
        """The key group of a state key."""
        return self._group_of(key)

    def encode(self, key: Hashable) -> bytes:
        """The stored form of ``key``: its group, then ``encode_key(key)``."""
        return _GROUP.pack(self._group_of(key)) + encode_key(key)

    def encode_many(self, keys: list) -> list:
        """:meth:`encode` of each of ``keys`` (a slice of a base), the keys by :func:`~.codec.encode_keys`.

        >>> keys = StateKeys(KeyGroups(8), routing_key=first)
        >>> some = [("a", 1), ("b", 2**70), ("c", "d"), ("é" * 300, 4)]
        >>> keys.encode_many(some) == [keys.encode(k) for k in some]
        True
        """
        if self._starts is not None:
            return encode_pairs(keys, self._starts, self._start_of, self.encode)
        pack, group_of = _GROUP.pack, self._group_of
        return [pack(group_of(key)) + raw for key, raw in zip(keys, encode_keys(keys))]

    def _start_of(self, first_item: str) -> tuple:
        """``(group prefix, pair_start)`` of a routing key, kept in ``_starts``."""
        starts = self._starts
        if len(starts) >= STARTS_KEPT:
            starts.clear()
        start = starts[first_item] = (_GROUP.pack(self.key_groups.group_of(first_item)), pair_start(first_item))
        return start

    @staticmethod
    def decode(raw: bytes) -> Any:
        """The state key of a stored one."""
        return decode(raw[PREFIX_BYTES:])

    @staticmethod
    def group(raw: bytes) -> int:
        """The key group of a stored key. O(1)."""
        return _GROUP.unpack_from(raw)[0]

    @staticmethod
    def bounds(groups: GroupRange) -> tuple:
        """``(first, end)``: every stored key of ``groups`` is ``>= first`` and ``< end`` in byte order."""
        return _GROUP.pack(groups.start), _GROUP.pack(groups.end)  # end <= MAX_MAX_PARALLELISM fits 2 bytes

    def from_legacy(self, raw: bytes) -> bytes:
        """A key stored before key groups (``encode_key`` alone), with its group prefix."""
        return _GROUP.pack(self._group_of(decode(raw))) + raw
