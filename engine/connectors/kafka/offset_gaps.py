"""OffsetGaps: a partition's batches delivered without holes, though a broker may make a
later batch visible before an earlier one.

Tansu assigns a batch its offsets before it stores it: with two producers on a partition
(the source's own ticks and the user's), a fetch can return offset 12 while 11 is still
being stored. A reader that moved on would lose record 11 for good. So what follows a hole
is held back until the hole fills, or until it has stayed ``wait_s`` seconds (compaction
leaves holes that stay): then it is skipped and logged.
"""

from __future__ import annotations

import logging
from typing import Optional

log = logging.getLogger(__name__)


class OffsetGaps:
    """Delivers a partition's batches without holes: what follows a hole in the offsets
    is held back until the hole fills, or until it has stayed ``wait_s`` seconds.

    Items are batches (anything with ``offset``, the first offset of it the reader has not
    had, and ``next_offset``), in offset order; offsets inside a batch are never a hole
    (a compacted batch keeps its offset range). Pure bookkeeping, O(batches) per fetch.
    ``next_offset`` is where the next fetch starts: past what was delivered, or at the hole
    (``refetch_from``) while one is waited for.

    >>> from types import SimpleNamespace as B
    >>> g = OffsetGaps(next_offset=10, wait_s=0.5)
    >>> [b.offset for b in g.admit([B(offset=10, next_offset=11), B(offset=12, next_offset=13)], now=0.0)], g.refetch_from, g.next_offset
    ([10], 11, 11)
    >>> g.admit([B(offset=12, next_offset=13)], now=0.1), g.refetch_from            # 11 still missing: wait
    ([], 11)
    >>> [b.offset for b in g.admit([B(offset=11, next_offset=12), B(offset=12, next_offset=13)], now=0.2)], g.refetch_from, g.filled
    ([11, 12], None, 1)
    >>> g.admit([B(offset=14, next_offset=20)], now=1.0)                            # a hole at 13, first seen
    []
    >>> [b.offset for b in g.admit([B(offset=14, next_offset=20)], now=1.6)], g.skipped, g.next_offset   # stayed 0.6 s: skipped
    ([14], 1, 20)
    """

    def __init__(self, next_offset: int, wait_s: float, name: str = "") -> None:
        self.next_offset = next_offset
        self.wait_s = wait_s
        self.name = name
        self.refetch_from: Optional[int] = None
        self.filled = 0
        self.skipped = 0
        self._hole: Optional[tuple] = None  # (first missing offset, when first seen)

    def admit(self, batches: list, now: float) -> list:
        """The prefix of ``batches`` to deliver. When it is shorter, ``refetch_from`` is the
        hole to fetch again from (None otherwise)."""
        self.refetch_from = None
        for i, b in enumerate(batches):
            if b.offset > self.next_offset:
                hole = self.next_offset
                if self._hole is None or self._hole[0] != hole:
                    self._hole = (hole, now)
                if now - self._hole[1] < self.wait_s:
                    self.refetch_from = hole
                    return batches[:i]
                self.skipped += 1
                self._hole = None
                log.warning("%s: offsets %d..%d never appeared within %.2f s: skipped", self.name, hole, b.offset - 1, self.wait_s)
            elif self._hole is not None and b.offset == self._hole[0]:
                self.filled += 1
                self._hole = None
            self.next_offset = max(self.next_offset, b.next_offset)
        return batches

    def moved_to(self, offset: int) -> None:
        """The reader seeked to ``offset`` on purpose (a jump, or back to a batch to read
        again): no hole before it."""
        self.next_offset = offset
        self._hole = None
