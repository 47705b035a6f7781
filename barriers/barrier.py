"""The output barrier: holds elements until the watermark settles them, then releases in order.

>>> b = Barrier()
>>> b.add(Meta(2, 0, 0, 2), "late-but-earlier?")
>>> b.add(Meta(1, 0, 0, 1), "first")
>>> b.add(Meta(2, 0, 0, 2, (), True), "late-but-earlier?")   # tombstone: deletes its invalidee
>>> b.add(Meta(2, 0, 0, 2), "fixed")
>>> b.release((2,)).payloads()        # only time 1 is settled
['first']
>>> b.release((3,)).payloads()
['fixed']

Tombstones and elements may arrive in any order. A tombstone always has the same
global time as its invalidee, and the watermark passes a time only when all of
its elements and tombstones have arrived; so the barrier resolves tombstones
when it releases, not when they arrive.

Costs: ``add`` is O(1); ``release`` sorts what was added since the last one, keeps it
as one more sorted run beside those it holds (a run is merged into the one before it
once that is at most twice its size, so there are O(log n) runs and each element is
merged O(log n) times), and takes the settled prefix of each run: O(k log k + r log n)
for k added and r runs, plus what it releases. It used to sort all it held on each
release, O(n) however little had settled: in a backlog a barrier holds the whole
credit window (~100k elements for the inverted index) and the watermark moves every
few milliseconds, and that sort took half of an in-process run's time.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Any, Optional

from driftstream.ordering.accelerators import accelerator
from driftstream.ordering.meta import Meta, invalidee_of

from .bundle import Bundle
from .settled import SettledCount

_meta = itemgetter(0)

#: ``_meta_sort.c``: the sort below in C (None where it is not built)
NATIVE = accelerator("driftstream.barriers._meta_sort")


def sort_pairs(pairs: list) -> None:
    """Sort ``(meta, payload)`` pairs in Meta order in place, ties as they were. In C where it
    is built (``_meta_sort.c``: each Meta read once into integers; Python's sort compared
    Meta tuples, mostly into their child ids, ~0.35 us an element of the index against
    ~0.12), ``list.sort`` for a list it does not take (a Meta of ints past 64 bits, more than
    six child ids) and where it is not built: the reference."""
    if NATIVE is None or not NATIVE.sort_pairs(pairs):
        pairs.sort(key=_meta)


class Barrier:
    """Buffer of one sink partition; releases bundles in Meta order."""

    def __init__(self) -> None:
        self._new: list = []  # (meta, payload) added since the last release, as they came
        self._runs: list = []  # sorted runs of what releases kept, oldest first
        self._tombstones: dict = {}  # invalidee meta -> payloads to cancel
        self.released = 0
        self.tombstones_released = 0
        self.dropped_replayed = 0
        #: the elements released or dropped as replayed, in all and below snapshots' T: status counts across recoveries
        self.settled = SettledCount()
        #: the last output the sink held at the last recovery (None: nothing): horizons, status
        self.t_last: Optional[Meta] = None
        #: replayed elements at or before it are dropped (usually ``t_last``, see skip_through)
        self._drop_through: Optional[Meta] = None

    def __len__(self) -> int:
        return len(self._new) + sum(map(len, self._runs))

    def add(self, meta: tuple, payload: Any) -> None:
        if meta[5]:
            self._tombstones.setdefault(invalidee_of(meta), []).append(payload)
        else:
            self._new.append((meta, payload))

    def add_many(self, items: list) -> None:
        """:meth:`add` of each ``(meta, payload, key)`` item (a step's outputs), in one C call
        (``split_items``) or one comprehension: a call per element was a sink step's whole
        cost. O(len(items))."""
        split = NATIVE.split_items(items) if NATIVE is not None and type(items) is list else None
        if split is not None:
            pairs, marked = split
            self._new += pairs
        else:
            pairs = [(m, p) for m, p, _ in items if not m[5]]
            self._new += pairs
            marked = [item for item in items if item[0][5]] if len(pairs) != len(items) else ()
        tombstones = self._tombstones
        for m, p, _ in marked:
            tombstones.setdefault(invalidee_of(m), []).append(p)

    def _take_settled(self, watermark: tuple) -> list:
        """The held elements below ``watermark``, in Meta order (equal Metas: as added)."""
        new, runs = self._new, self._runs
        if new:
            sort_pairs(new)
            runs.append(new)
            self._new = []
            while len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1]):
                last = runs.pop()
                merged = runs[-1] + last
                if last[0][0] < runs[-1][-1][0]:  # runs are never empty: releases drop the emptied ones
                    sort_pairs(merged)  # two runs: merged in O(n)
                runs[-1] = merged
        parts = []
        for run in runs:
            if not run[0][0] < watermark:
                continue
            n = len(run) if run[-1][0] < watermark else bisect_left(run, watermark, key=_meta)
            parts.append(run[:n])
            del run[:n]
        self._runs = [run for run in runs if run]
        if len(parts) == 1:
            return parts[0]
        ready = [item for part in parts for item in part]
        sort_pairs(ready)  # the runs in the order they were added: a stable merge
        return ready

    def skip_through(self, t_last: Optional[Meta], drop_through: Any = ...) -> None:
        """Drop, now and from now on, every element at or before ``t_last``.

        After recovery the sink already holds everything up to its last bundle;
        replayed copies of it must not be released again (exactly-once).
        ``drop_through``: drop up to it instead (None: nothing), for a sink whose ``t_last`` is
        the latest of several parts, each written in t order, which drops per part itself.
        """
        self.t_last = t_last
        self._drop_through = t_last if drop_through is ... else drop_through

    def release(self, watermark: tuple) -> Bundle:
        """Pop every element below ``watermark``, in Meta order, as one bundle."""
        ready = self._take_settled(watermark)
        if self._tombstones:
            ready = self._cancel(ready, watermark)
        self.settled.add(ready)
        through = self._drop_through
        if through is not None and ready and not through < ready[0][0]:
            n = bisect_right(ready, through, key=_meta)  # ready is in Meta order: what is at or before it leads
            ready = ready[n:]
            self.dropped_replayed += n
        self.released += len(ready)
        return Bundle(ready)

    def _cancel(self, ready: list, watermark: tuple) -> list:
        """``ready`` without the elements the settled tombstones invalidate (each tombstone
        cancels one equal payload at its invalidee's Meta, the first in order); a settled
        tombstone whose element never came is counted and kept visible. Looked up by
        bisection in ``ready`` (in Meta order; in C where it is built, ``lower_bounds``):
        O(held tombstones + settled ones x log n) plus a copy when one cancels, where a dict
        lookup per element was a third of a release in an index backlog."""
        tombstones, drop = self._tombstones, []
        # A look at each held one per release: a heap of them cost more (a push and a pop a
        # tombstone, ~1.5 us) than this scan of the few releases a backlog makes.
        settled = [m for m in tombstones if m < watermark]
        if not settled:
            return ready
        settled.sort()
        starts = NATIVE.lower_bounds(ready, settled) if NATIVE is not None else None
        if starts is None:
            metas, i, starts = list(map(_meta, ready)), 0, []
            for meta in settled:  # in order: each search starts where the last one ended
                i = bisect_left(metas, meta, i)
                starts.append(i)
        for meta, i in zip(settled, starts):
            cancel = tombstones.pop(meta)
            while cancel and i < len(ready) and ready[i][0] == meta:
                if ready[i][1] in cancel:
                    cancel.remove(ready[i][1])
                    drop.append(i)
                i += 1
            # Settled yet unmatched: the element it invalidates never came. Keep it visible.
            self.tombstones_released += len(cancel)
        if not drop:
            return ready
        kept, start = [], 0
        for i in drop:
            kept += ready[start:i]
            start = i + 1
        kept += ready[start:]
        return kept
