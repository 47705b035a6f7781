"""The acker: XOR-tracking of in-flight elements per global time, and the watermark.

Every batch sent between instances gets a random 64-bit id. The sender XORs it
into the entry of each global time in the batch; the receiver XORs it again,
in the same flush as the ids of everything it emitted for that batch. An entry
is back to zero exactly when every element of that time has been fully
processed (up to a 2^-64 chance of a false zero per id).

The watermark is the exclusive frontier below which every time is settled:

    watermark = min(successor(min(source bounds)), earliest non-zero entry)

>>> a = Acker(sources=1)
>>> a.update({(1, 0, 0, 1): 0xA5}, source=0, bound=(1, 0, 0, 1))
(1, 0, 0, 1)
>>> a.update({(1, 0, 0, 1): 0xA5})               # the receiver acks: time 1 settles
(1, 0, 0, 2)
>>> a.update({}, source=0, bound=TOP)            # the source is exhausted
(inf,)

Costs: ``update`` is O(k log n) for k entries touched, n live entries;
reading the watermark is amortised O(log n) (a heap with lazy deletion).
"""

from __future__ import annotations

import heapq
from typing import Mapping, Optional, Sequence

from .ack_table import AckTable
from .meta import BOTTOM, TOP, Time, successor


class Acker:
    """XOR table plus per-source-instance bounds; computes the watermark."""

    def __init__(self, sources: int) -> None:
        # One bound per source *instance*; BOTTOM until it reports.
        self.bounds: list = [BOTTOM] * sources
        # The least bound and how many sources hold it: min(bounds) per update cost O(sources),
        # 9 of 13 µs an ack at 512 sources; recomputed only when its last holder moves on.
        self._least: Time = BOTTOM if sources else TOP
        self._at_least = sources
        self.entries = AckTable()
        self._heap: list = []
        self.watermark: Time = BOTTOM if sources else TOP

    def update(self, xors: Mapping, source: Optional[int] = None, bound: Optional[Time] = None) -> Time:
        """Fold one flush of XORs (and, from a source instance, its new bound).

        A source sends its XORs and the bound that covers them in one call, so the
        acker can never see the bound before the ids of what it covers.
        Returns the watermark after the update.
        """
        heap = self._heap
        for t in self.entries.fold(xors):
            heapq.heappush(heap, t)
        if bound is not None:
            self._set_bound(source, bound)
        return self._recompute()

    def _set_bound(self, source: int, bound: Time) -> None:
        """Source ``source``'s new bound; keeps the least bound (amortised O(1) while the
        sources advance together, O(sources) when the last source at the least one moves)."""
        bounds = self.bounds
        old, bounds[source] = bounds[source], bound
        least = self._least
        if old == least:
            self._at_least -= 1
        if bound < least:
            self._least, self._at_least = bound, 1
        elif bound == least:
            self._at_least += 1
        elif not self._at_least:
            least = self._least = min(bounds)
            self._at_least = bounds.count(least)

    def update_many(self, xors: Mapping, bounds: Mapping) -> Time:
        """Fold a shard's batch (:class:`~.ack_shards.AckShard`): the net XORs of whole flushes
        and the newest bound of each source among them (source index -> bound). The XORs go in
        before the bounds, as a single flush's do. Returns the watermark after the update.

        >>> a = Acker(sources=2)
        >>> a.update_many({(1, 0, 0, 1): 7}, {0: (1, 0, 0, 1), 1: (2, 0, 1, 2)})
        (1, 0, 0, 1)
        """
        heap = self._heap
        for t in self.entries.fold(xors):
            heapq.heappush(heap, t)
        for source, bound in bounds.items():
            self._set_bound(source, bound)
        return self._recompute()

    def in_flight(self) -> int:
        """Number of global times with elements still in flight (O(1))."""
        return len(self.entries)

    def frontier(self, sources: Optional[Sequence[int]] = None) -> Time:
        """The least bound over the source instances ``sources`` (default: all): each has
        emitted everything up to it (aligned sources read up to a slack past their own
        source's frontier). O(sources).

        >>> a = Acker(sources=2); a.update({}, source=0, bound=(3, 0, 0, 3)); a.frontier()
        (-inf,)
        (-inf,)
        >>> a.update({}, source=1, bound=(5, 0, 1, 2)); a.frontier()
        (3, 0, 0, 4)
        (3, 0, 0, 3)
        """
        if sources is not None:
            return min((self.bounds[i] for i in sources), default=TOP)
        return min(self.bounds) if self.bounds else TOP

    def settled(self) -> bool:
        """True when the watermark is as far as the sources' bounds let it go: nothing they
        emitted is in flight below them. With the sources stopped, the watermark then stays
        where it is (what a rescale's snapshot waits for). O(sources).

        >>> a = Acker(sources=1)
        >>> a.update({(1, 0, 0, 1): 0xA5}, source=0, bound=(1, 0, 0, 1)); a.settled()
        (1, 0, 0, 1)
        False
        >>> a.update({(1, 0, 0, 1): 0xA5}); a.settled()
        (1, 0, 0, 2)
        True
        """
        return self.watermark >= (successor(min(self.bounds)) if self.bounds else TOP)

    def _recompute(self) -> Time:
        heap, entries = self._heap, self.entries
        while heap and heap[0] not in entries:
            heapq.heappop(heap)
        frontier = successor(self._least) if self.bounds else TOP
        if heap and heap[0] < frontier:
            frontier = heap[0]
        # The frontier never moves back: new entries only appear at or above it.
        if frontier > self.watermark:
            self.watermark = frontier
        return self.watermark
