"""Input merge: a stage instance takes what several senders send in t order, not in arrival order.

Each sender's items arrive mostly in t order (one connection is FIFO, and a sender
emits in t order, but for a stateful step's batch, made key by key: an item out of
order is only released later or earlier than it could be), but two senders interleave: in a backlog, sender A's batch covering
documents 100-104 lands before sender B's covering 101-105, and a stateful step
after the entry repairs every key of B's batch that A's already touched (the
inverted index: a third of its elements, from a 2-partition topic). So items are
held until every *active* sender has sent something at least as late, then
released merged in t order: the k-way merge of Flink's and Timely's input
frontiers, by the senders' own progress instead of extra progress messages.

A sender that sent nothing for ``quiet_s`` seconds does not hold the others back (it
is idle, done, or gone): at the live edge, where one element at a time arrives,
nothing waits. A sender that said it has more to send (``more``: its input is
backlogged, so its next batch is on the way however long it takes to make) holds
them back until its next batch, for ``max_hold_s`` at the most (a sender paused or
lost meanwhile). The merge is
an optimisation only: drifting state gives the same output in any order, so a
held item is just one that lands a little later, and one released out of order is
repaired as before. Callers must not acknowledge an offer before it is released
(:meth:`take` returns the tokens of the offers it finished): held items stay above
the watermark.

>>> m = InputMerge(quiet_s=0.002, max_hold_s=1.0)
>>> m.offer("A", 0, [((1,), "a1"), ((5,), "a5")], "batch-A", now=0.0)
>>> m.offer("B", 0, [((2,), "b2"), ((3,), "b3")], "batch-B", now=0.0, more=True)
>>> released, done = m.take(now=0.0)
>>> [p for _, p in released[0]], done           # a5 waits: B may still send a 4
(['a1', 'b2', 'b3'], ['batch-B'])
>>> m.take(now=0.5)                             # B said it has more: a5 still waits
({}, [])
>>> m.offer("B", 0, [((6,), "b6")], "batch-B2", now=0.6)
>>> released, done = m.take(now=0.6)            # A has been quiet for 0.6 s: nothing waits
>>> [p for _, p in released[0]], done, m.holding
(['a5', 'b6'], ['batch-A', 'batch-B2'], False)
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any, Hashable

_meta_of = operator.itemgetter(0)


class _Sender:
    __slots__ = ("held", "last", "seen", "more")

    def __init__(self) -> None:
        self.held: deque = deque()  # [entry, items, next index, token], oldest first
        self.last: Any = None  # the latest meta it sent
        self.seen = float("-inf")  # when it last sent
        self.more = False  # its last batch said more is on the way


class InputMerge:
    """Holds each sender's items until the other active senders have caught up in t."""

    def __init__(self, quiet_s: float, max_hold_s: float) -> None:
        self.quiet_s = quiet_s
        self.max_hold_s = max_hold_s
        self._senders: dict = {}
        self._held = 0  # items held over all senders

    @property
    def holding(self) -> bool:
        """Whether any item waits. O(1)."""
        return self._held > 0

    def offer(self, sender: Hashable, entry: Any, items: list, token: Any, now: float, more: bool = False) -> None:
        """``items`` (``(meta, ...)`` tuples in t order) from ``sender`` for step ``entry``;
        ``token`` comes back from :meth:`take` once all of them are released; ``more``: the
        sender has more to send at once. O(1)."""
        s = self._senders.get(sender)
        if s is None:
            s = self._senders[sender] = _Sender()
        s.seen, s.more = now, more
        s.held.append([entry, items, 0, token, 0])  # the last: how far partly_released reported it
        if not items:
            return
        self._held += len(items)
        last = items[-1][0]
        if s.last is None or last > s.last:
            s.last = last

    def take(self, now: float) -> tuple:
        """``(entry -> items in t order, tokens of the offers now wholly released)``: every
        held item at or below the least latest meta of the active senders (heard from within
        ``quiet_s``, or ``max_hold_s`` if they said more was coming). O(released + senders),
        plus the merge's sort (timsort over the senders' sorted runs)."""
        quiet, hold = self.quiet_s, self.max_hold_s
        active = [s.last for s in self._senders.values() if s.last is not None and now - s.seen <= (hold if s.more else quiet)]
        frontier = min(active) if active else None
        released: dict = {}
        done: list = []
        merged: set = set()
        for s in self._senders.values():
            held = s.held
            while held:
                offer = held[0]
                entry, items, i, token, _ = offer
                j = len(items) if frontier is None else _upto(items, i, frontier)
                if j > i:
                    out = released.get(entry)
                    if out is None:
                        released[entry] = items[i:j] if i or j < len(items) else items
                    else:
                        out = released[entry] = out + items[i:j]
                        merged.add(entry)
                    self._held -= j - i
                if j < len(items):
                    offer[2] = j
                    break
                held.popleft()
                done.append(token)
        for entry in merged:
            released[entry].sort(key=_meta_of)
        return released, done

    def partly_released(self) -> list:
        """``(token, least meta of its held items)`` for each offer some of whose items are
        released and some held (only a sender's oldest offer can be), once per release:
        an offer whose release did not move since the last call is not reported again.
        O(senders + held items of the offers reported): a batch is not always in t order
        (a stateful step emits key by key), so the least held item is looked for, not
        taken to be the first.

        A caller that acknowledges per offer can move the offer's hold on the watermark up
        to what it still holds: its released part is done, and an item held for another
        sender must not keep the watermark below that sender's own items (whose source waits
        for the watermark to read on).

        >>> m = InputMerge(quiet_s=0.002, max_hold_s=1.0)
        >>> m.offer("A", 0, [((1,), "a1"), ((5,), "a5")], "batch-A", now=0.0)
        >>> m.offer("B", 0, [((3,), "b3")], "batch-B", now=0.0, more=True)
        >>> _ = m.take(now=0.0); m.partly_released(), m.partly_released()
        ([('batch-A', (5,))], [])
        """
        out = []
        for s in self._senders.values():
            if s.held:
                offer = s.held[0]
                _, items, i, token, reported = offer
                if i != reported:
                    offer[4] = i
                    out.append((token, min(items[i:], key=_meta_of)[0]))
        return out

    def take_all(self) -> tuple:
        """Everything held, as :meth:`take` returns it (a stop, a drain)."""
        return self.take(now=float("inf"))


def _upto(items: list, i: int, frontier: Any) -> int:
    """The end of the run of ``items[i:]`` at or below ``frontier`` (binary search: the
    items are in t order). O(log n)."""
    if items[-1][0] <= frontier:
        return len(items)
    lo, hi = i, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid][0] <= frontier:
            lo = mid + 1
        else:
            hi = mid
    return lo
