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

Costs: ``add`` is O(1); ``release`` sorts the buffer (Timsort: near O(n) when
most of it was sorted at the previous release) and is O(n) in what it keeps.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import Any, Optional

from driftstream.ordering.meta import Meta, invalidee_of

from .bundle import Bundle

_meta = itemgetter(0)


class Barrier:
    """Buffer of one sink partition; releases bundles in Meta order."""

    def __init__(self) -> None:
        self._items: list = []  # (meta, payload), sorted up to the last release
        self._tombstones: dict = {}  # invalidee meta -> payloads to cancel
        self.released = 0
        self.tombstones_released = 0
        self.dropped_replayed = 0
        self.t_last: Optional[Meta] = None

    def __len__(self) -> int:
        return len(self._items)

    def add(self, meta: tuple, payload: Any) -> None:
        if meta[5]:
            self._tombstones.setdefault(invalidee_of(meta), []).append(payload)
        else:
            self._items.append((meta, payload))

    def skip_through(self, t_last: Optional[Meta]) -> None:
        """Drop, now and from now on, every element at or before ``t_last``.

        After recovery the sink already holds everything up to its last bundle;
        replayed copies of it must not be released again (exactly-once).
        """
        self.t_last = t_last

    def release(self, watermark: tuple) -> Bundle:
        """Pop every element below ``watermark``, in Meta order, as one bundle."""
        items = self._items
        if not items:
            ready: list = []
        else:
            items.sort(key=_meta)
            n = len(items) if items[-1][0] < watermark else bisect_left(items, watermark, key=_meta)
            ready = items[:n]
            del items[:n]
        tombstones = self._tombstones
        if tombstones:
            kept = []
            for meta, payload in ready:
                cancel = tombstones.get(meta)
                if cancel and payload in cancel:
                    cancel.remove(payload)
                    if not cancel:
                        del tombstones[meta]
                else:
                    kept.append((meta, payload))
            ready = kept
            for meta in [m for m in tombstones if m < watermark]:
                # Settled yet unmatched: the element it invalidates never came. Keep it visible.
                self.tombstones_released += len(tombstones.pop(meta))
        if self.t_last is not None and ready:
            before = len(ready)
            ready = [e for e in ready if e[0] > self.t_last]
            self.dropped_replayed += before - len(ready)
        self.released += len(ready)
        return Bundle(ready)
