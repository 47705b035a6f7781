"""What a barrier settled: the elements it let go, released to its sink or dropped as
replayed output the sink already held, counted over the run of one incarnation, and
below the T of each snapshot taken.

A recovery restarts from a snapshot at T; the elements a sink got below T are not
replayed, so a run's count across recoveries is the snapshot's count below T plus what
the new incarnation settles (the replayed output the sink already held counts: it is in
the sink once). The count below T is taken at watermark T (:meth:`SettledCount.mark`):
what was settled so far, plus the elements below T of the next release, which holds
those that waited while the sink wrote the bundle before (a release at watermark W
holds every element below W not released before).

A sink of dead letters counts them per failing step (``by``: a payload -> its step, or
None to count it under None), decided on its first element (``decide``), so a plain
sink pays O(1) per release.

>>> from driftstream.ordering.meta import Meta
>>> s = SettledCount()
>>> s.add([(Meta(1, 0, 0, 1), "a")])
>>> s.mark((3,))                                   # a snapshot at T=3; (2, ...) still held
>>> s.add([(Meta(2, 0, 0, 2), "b"), (Meta(4, 0, 0, 4), "c")])
>>> s.take_mark((3,)), s.total()
({None: 2}, 3)
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import Any, Callable, Optional

_meta = itemgetter(0)


class SettledCount:
    """A barrier's settled elements: ``counts`` (per key: None, or a dead letter's step)
    and the counts below the T of each open snapshot mark."""

    __slots__ = ("counts", "marks", "by", "decide")

    def __init__(self, decide: Optional[Callable[[Any], Optional[Callable[[Any], Any]]]] = None) -> None:
        self.counts: dict = {}
        self.marks: list = []  # [t, counts below t], oldest first
        #: payload -> its key (None: one count for all), decided on the first element
        self.by: Optional[Callable[[Any], Any]] = None
        self.decide = decide

    def add(self, ready: list) -> None:
        """Count ``ready``, the ``(meta, payload)`` pairs one release settled, in Meta order.
        O(1) for a plain sink, plus O(log n) per open mark; O(n) for a sink of dead letters."""
        if not ready:
            return
        if self.decide is not None:
            self.by, self.decide = self.decide(ready[0][1]), None
        _add(self.counts, ready, self.by)
        for mark in self.marks:
            n = bisect_left(ready, mark[0], key=_meta)
            if n:
                _add(mark[1], ready[:n] if self.by is not None else range(n), self.by)

    def mark(self, t: tuple) -> None:
        """Open the count below ``t``, at watermark ``t`` (a snapshot's marker)."""
        self.marks.append([t, dict(self.counts)])

    def take_mark(self, t: tuple) -> Optional[dict]:
        """The count below ``t`` (final once a release at or above ``t`` was settled), and
        forget it; None if no mark at ``t`` is open."""
        for i, (mt, counts) in enumerate(self.marks):
            if mt == t:
                del self.marks[i]
                return counts
        return None

    def total(self) -> int:
        return sum(self.counts.values())


def _add(counts: dict, items: Any, by: Optional[Callable[[Any], Any]]) -> None:
    if by is None:
        counts[None] = counts.get(None, 0) + len(items)
        return
    for _, payload in items:
        key = by(payload)
        counts[key] = counts.get(key, 0) + 1
