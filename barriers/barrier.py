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

Tombstones and elements may arrive in any order: a tombstone whose invalidee is
not here yet waits for it and the two annihilate. A barrier releases nothing
that a tombstone could still delete, because a tombstone always has the same
global time as its invalidee and the watermark passes a time only when all of
its elements and tombstones have arrived.

Costs: ``add`` is O(log n); ``release`` is O(k log n) for k released elements.
"""

from __future__ import annotations

import heapq
from typing import Any, Optional

from driftstream.ordering.meta import Meta

from .bundle import Bundle


class Barrier:
    """Buffer of one sink partition; releases bundles in Meta order."""

    def __init__(self) -> None:
        self._heap: list = []        # metas (a Meta may be pushed once per live payload)
        self._buffer: dict = {}      # meta -> list of payloads
        self._pending_tombstones: dict = {}  # invalidee meta -> list of payloads
        self.released = 0
        self.tombstones_released = 0
        self.dropped_replayed = 0
        self.t_last: Optional[Meta] = None

    def __len__(self) -> int:
        return sum(len(v) for v in self._buffer.values())

    def add(self, meta: Meta, payload: Any) -> None:
        if meta[5]:
            invalidee = meta.invalidee()
            live = self._buffer.get(invalidee)
            if live is not None and payload in live:
                live.remove(payload)
                if not live:
                    del self._buffer[invalidee]
            else:
                self._pending_tombstones.setdefault(invalidee, []).append(payload)
            return
        pending = self._pending_tombstones.get(meta)
        if pending is not None and payload in pending:
            pending.remove(payload)
            if not pending:
                del self._pending_tombstones[meta]
            return
        live = self._buffer.get(meta)
        if live is None:
            self._buffer[meta] = [payload]
        else:
            live.append(payload)
        heapq.heappush(self._heap, meta)

    def skip_through(self, t_last: Optional[Meta]) -> None:
        """Drop, now and from now on, every element at or before ``t_last``.

        After recovery the sink already holds everything up to its last bundle;
        replayed copies of it must not be released again (exactly-once).
        """
        self.t_last = t_last

    def release(self, watermark: tuple) -> Bundle:
        """Pop every element below ``watermark``, in Meta order, as one bundle."""
        heap, buffer = self._heap, self._buffer
        out: list = []
        while heap and heap[0] < watermark:
            meta = heapq.heappop(heap)
            live = buffer.get(meta)
            if not live:
                continue  # annihilated by a tombstone after it was pushed
            out.append((meta, live.pop(0)))
            if not live:
                del buffer[meta]
        if self._pending_tombstones:
            for meta, payloads in list(self._pending_tombstones.items()):
                if meta < watermark:
                    # Settled yet unmatched: the element it invalidates never came. Keep it visible.
                    self.tombstones_released += len(payloads)
                    del self._pending_tombstones[meta]
        if self.t_last is not None and out:
            before = len(out)
            out = [e for e in out if e[0] > self.t_last]
            self.dropped_replayed += before - len(out)
        self.released += len(out)
        return Bundle(out)
