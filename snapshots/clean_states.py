"""The clean states of a :class:`~.state_cache.StateCache`: those RocksDB holds as cached, oldest written first.

A clean state may be dropped from memory at no cost but a later read, so these are what a
cache over its budget drops first, in the order they became clean (the oldest write is the
one least likely to be read again soon). Each carries the size it was measured at, so the
bytes freed are known without measuring again.

>>> clean = CleanStates()
>>> clean.add("a", 10); clean.add("b", 20); clean.add("c", 5); clean.bytes
35
>>> clean.drop_oldest(15), clean.bytes      # the oldest that free at least 15 bytes
(['a', 'b'], 5)
>>> clean.discard("c"); clean.discard("c"); len(clean), clean.bytes
(0, 0)
"""

from __future__ import annotations

from typing import Hashable


class CleanStates:
    """Keys of clean states with their sizes, in the order they became clean."""

    def __init__(self) -> None:
        #: key -> size, oldest first. The cache's C loops (``snapshots/_written.c``) add to it and
        #: pop from it directly and return the bytes they changed (see :meth:`changed_by`).
        #: :meth:`drop_oldest` may replace the dict: take it anew for each use.
        self.sizes: dict = {}
        #: Bytes the clean states hold, by their measured sizes.
        self.bytes = 0
        self._dropped = 0  # keys dropped from the front of ``sizes`` since it was last compacted

    def __len__(self) -> int:
        return len(self.sizes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.sizes

    def add(self, key: Hashable, size: int) -> None:
        """``key``'s state is clean now, at ``size`` bytes (it must not be clean already). O(1)."""
        self.sizes[key] = size
        self.bytes += size

    def discard(self, key: Hashable) -> None:
        """``key``'s state is dirty again, or gone (nothing if it was not clean). O(1)."""
        size = self.sizes.pop(key, None)
        if size is not None:
            self.bytes -= size

    def changed_by(self, delta: int) -> None:
        """Count ``delta`` bytes added (or, negative, freed) by a loop that edited :attr:`sizes`. O(1)."""
        self.bytes += delta

    def drop_oldest(self, excess: int) -> list:
        """Forget the oldest clean keys that hold at least ``excess`` bytes (all of them if they
        hold less), and return them, oldest first. O(keys dropped), amortised."""
        victims, freed, sizes = [], 0, self.sizes
        for key, size in sizes.items():
            if freed >= excess:
                break
            victims.append(key)
            freed += size
        for key in victims:
            del sizes[key]
        self.bytes -= freed
        # A dict keeps the slot of every key dropped from its front until it grows, and each
        # walk above starts over them: over budget while a base was pending, a put cost
        # 35 µs instead of 4 with 100k dropped slots (and more with more). Compact it once it
        # has dropped more keys than it holds: O(1) amortised.
        self._dropped += len(victims)
        if self._dropped > len(sizes):
            self.sizes, self._dropped = dict(sizes), 0
        return victims
