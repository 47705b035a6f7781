"""The acker's XOR tables per channel incarnation, for local recovery (``recovery="local"``).

The default acker (:class:`~.acker.Acker`) XORs every id into one table keyed by time, so
what a dead instance held cannot be told from the rest. Here a batch's send and its ack
meet in the table of its channel, ``(sender incarnation, receiver incarnation)`` (an
instance's own timers: ``(its incarnation, its incarnation)``). A failure discards every
table of the dead incarnation (its inputs and outputs not yet acked, its timers) and drops
whatever XOR still comes for it; :meth:`ChannelAcker.hold` keeps a time open until the
upstream replays are in the tables. The watermark is the least open time over all tables,
holds and source bounds, and never moves back; :meth:`ChannelAcker.frontier_raw` is that
least time without the clamp: what a replacement restored at ``T`` may be told while it
catches up (the others are already past it).

Keys of a flush are ``(channel, t)``; the cost per batch is the default's (a dict update),
in a dict per channel.

>>> a = ChannelAcker(sources=1)
>>> a.update({((1, 2), (1, 0, 0, 1)): 0xA5}, source=0, bound=(1, 0, 0, 1))  # 1 sends to 2
(1, 0, 0, 1)
>>> a.discard(2)                     # incarnation 2 died: its channels go
[(1, 2)]
>>> a.update({((1, 2), (1, 0, 0, 1)): 0xA5})       # its late ack: dropped by its tag
(1, 0, 0, 2)
>>> a.update({}, source=(0, 2), bound=(9, 0, 0, 9))  # a bound it sent, come late: dropped too
(1, 0, 0, 2)
>>> a.hold("replay", (1, 0, 0, 1)); a.frontier_raw(), a.watermark
((1, 0, 0, 1), (1, 0, 0, 2))
>>> a.release("replay")
(1, 0, 0, 2)
"""

from __future__ import annotations

import heapq
from typing import Any, Hashable, Mapping, Optional

from .ack_table import AckTable
from .acker import Acker
from .meta import BOTTOM, TOP, Time, successor


class ChannelAcker(Acker):
    """:class:`~.acker.Acker` with a table per channel ``(sender incarnation, receiver
    incarnation)``: :meth:`discard` forgets an incarnation's channels, :meth:`hold` keeps a
    time open. ``update``'s keys are ``(channel, t)``; incarnations are any hashable tags."""

    def __init__(self, sources: int) -> None:
        super().__init__(sources)
        #: channel -> its table (times still in flight on it)
        self.tables: dict = {}
        #: incarnations discarded: XORs of their channels are dropped
        self.dead: set = set()
        #: token -> the time it holds open
        self.holds: dict = {}
        self._heap: list = []  # (t, channel), lazily deleted
        #: receiver incarnation -> its heap of (t, channel), lazily deleted, while frontiers per
        #: receiver are asked for (see receiver_frontiers.py; None: not kept)
        self.by_receiver: Optional[dict] = None
        #: a replacement replica catching up (its incarnation) -> its heap of (t, channel) of the
        #: channels into it (its timers too), lazily deleted: out of the watermark until it joins
        self.aside: dict = {}

    def _fold(self, xors: Mapping) -> None:
        tables, dead, heap, by_receiver, aside = self.tables, self.dead, self._heap, self.by_receiver, self.aside
        for (channel, t), x in xors.items():
            if channel[0] in dead or channel[1] in dead:
                continue  # the dead incarnation's, come late
            table = tables.get(channel)
            if table is None:
                table = tables[channel] = AckTable()
            v = table.get(t, 0) ^ x
            if v:
                if t not in table:
                    heapq.heappush(aside[channel[1]] if aside and channel[1] in aside else heap, (t, channel))
                    if by_receiver is not None:
                        heapq.heappush(by_receiver.setdefault(channel[1], []), (t, channel))
                table[t] = v
            elif t in table:
                del table[t]

    def update(self, xors: Mapping, source: Any = None, bound: Optional[Time] = None) -> Time:
        """Fold one flush: ``xors`` keyed ``(channel, t)``, and a source's new bound (``source``:
        its index, or ``(index, incarnation)``: a dead incarnation's bound is dropped)."""
        self._fold(xors)
        if bound is not None:
            self._bound(source, bound)
        return self._recompute()

    def update_many(self, xors: Mapping, bounds: Mapping) -> Time:
        """As :meth:`~.acker.Acker.update_many`: keys ``(channel, t)``, sources as in :meth:`update`."""
        self._fold(xors)
        for source, bound in bounds.items():
            self._bound(source, bound)
        return self._recompute()

    def _bound(self, source: Any, bound: Time) -> None:
        if type(source) is tuple:
            if source[1] in self.dead:
                return  # sent before its instance failed, come late (an acker shard's batch in flight)
            source = source[0]
        self._set_bound(source, bound)

    def discard(self, incarnation: Hashable) -> list:
        """Incarnation ``incarnation`` died: drop its channels' tables, and every XOR that comes
        for them later. Returns the channels dropped. O(channels)."""
        self.dead.add(incarnation)
        self.aside.pop(incarnation, None)
        gone = [ch for ch in self.tables if ch[0] == incarnation or ch[1] == incarnation]
        for ch in gone:
            del self.tables[ch]
        return gone

    def reset_bound(self, source: int) -> None:
        """Source instance ``source`` restarts from a snapshot: its bound is unknown until it
        reports one (the watermark does not move back; :meth:`frontier_raw` does)."""
        self._set_bound(source, BOTTOM)

    def hold(self, token: Any, t: Time) -> None:
        """Keep ``t`` open until :meth:`release` of ``token`` (a replay not yet in the tables)."""
        self.holds[token] = t

    def release(self, token: Any) -> Time:
        """End the hold of ``token``; returns the watermark."""
        self.holds.pop(token, None)
        return self._recompute()

    def keep_receivers(self, keep: bool) -> None:
        """Keep (or stop keeping) a heap per receiver, for :meth:`least_by_receiver`; the
        heaps are built from the tables (O(entries log entries)), then kept at a push per new entry."""
        if not keep:
            self.by_receiver = None
            return
        self.by_receiver = {}
        for channel, table in self.tables.items():
            self.by_receiver.setdefault(channel[1], []).extend((t, channel) for t in table)
        for h in self.by_receiver.values():
            heapq.heapify(h)

    def least_by_receiver(self) -> dict:
        """Receiver incarnation -> the least time open on a channel into it (its timers
        included), from the heaps :meth:`keep_receivers` keeps. Amortised O(receivers)."""
        tables, out = self.tables, {}
        for receiver, h in self.by_receiver.items():
            while h:
                t, channel = h[0]
                table = tables.get(channel)
                if table is not None and t in table:
                    out[receiver] = t
                    break
                heapq.heappop(h)
        return out

    def set_aside(self, incarnation: Hashable) -> None:
        """Keep the channels into ``incarnation`` (a replacement replica, whose output is dropped:
        no one waits for it), its timers and the holds put for it (tokens ``(incarnation, ...)``)
        out of the watermark until :meth:`join`: its backlog would stop every instance's output.
        A new incarnation: no channel into it is open yet."""
        self.aside[incarnation] = []

    def frontier_of(self, incarnation: Hashable) -> Time:
        """What ``incarnation`` may be told: :meth:`frontier_raw`, and if it is set aside, no
        further than its own channels' least open time and its holds."""
        frontier = self.frontier_raw()
        heap = self.aside.get(incarnation)
        if heap is None:
            return frontier
        least = self._least_of(heap)
        if least < frontier:
            frontier = least
        for token, t in self.holds.items():
            if t < frontier and token[0] == incarnation:
                frontier = t
        return frontier

    def join(self, incarnation: Hashable) -> None:
        """``incarnation`` caught up (:meth:`frontier_of` met the watermark): its channels count
        in the watermark from now on."""
        for entry in self.aside.pop(incarnation, ()):
            heapq.heappush(self._heap, entry)

    def _least_entry(self) -> Time:
        return self._least_of(self._heap)

    def _least_of(self, heap: list) -> Time:
        tables = self.tables
        while heap:
            t, channel = heap[0]
            table = tables.get(channel)
            if table is not None and t in table:
                return t
            heapq.heappop(heap)
        return TOP

    def frontier_raw(self) -> Time:
        """The least open time over the tables, holds and bounds, unclamped: below it nothing
        is in flight or can still come. Only a replacement catching up is told it."""
        frontier = successor(self._least) if self.bounds else TOP
        least = self._least_entry()
        if least < frontier:
            frontier = least
        aside = self.aside
        for token, t in self.holds.items():
            if t < frontier and not (aside and token[0] in aside):
                frontier = t
        return frontier

    def in_flight(self) -> int:
        """Open (channel, time) entries."""
        return sum(len(table) for table in self.tables.values())

    def _recompute(self) -> Time:
        frontier = self.frontier_raw()
        if frontier > self.watermark:
            self.watermark = frontier
        return self.watermark
