"""The acker's protocol, written once: what it does with a stage instance's message and
what it sends back. The Ray :class:`~.actors.AckerActor` drives it over the data plane
and its event loop; the simulator (:mod:`.simulator`) drives it under its seeded
scheduler. Only the transport (``send``) and the scheduling of coalesced work (``defer``)
differ.

>>> from driftstream.engine.model.plan import Instance
>>> from driftstream.engine.runtime.protocol import Ack
>>> sent = []
>>> acker = AckerHost(1, lambda to, message: sent.append((to, message)), subscribers=[Instance(0, 0)])
>>> acker.receive(Ack({}, 0, (5, 0, 0, 5)))                       # the source emitted up to t=(5, 0, 0, 5)
>>> acker.pushed, sent                                            # everything before the next time is complete
((5, 0, 0, 6), [(Instance(stage=0, index=0), Watermark(t=(5, 0, 0, 6), snapshot_id=None))])
>>> acker.begin_snapshot(1).missing, sent[-1][1]
([Instance(stage=0, index=0)], Watermark(t=(5, 0, 0, 6), snapshot_id=1))

Costs: :meth:`receive` is the table's update (O(times in the message)) plus, for a bound
of aligned sources, one frontier per group (coalesced where ``defer`` defers).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import BOTTOM, TOP
from driftstream.ordering.receiver_frontiers import ReceiverFrontiers

from driftstream.engine.model.manifest import PartCollector
from driftstream.engine.runtime.protocol import Align, Prepared, ShardFlush, Told, Watermark


def at_once(fn: Callable[[], None]) -> None:
    """The simulator's ``defer``: run now (its scheduler already interleaves everything)."""
    fn()


class AckerHost:
    """The acker of one incarnation over ``sources`` source instances.

    ``send(to, message)``: a control message for stage instance ``to``; ``defer(fn)``: run
    ``fn`` soon, after the messages already received (the Ray loop's ``call_soon``: a burst
    of acks then pushes one watermark); ``finish(w)``: how the last watermark (TOP) goes
    out (None: like any other). ``subscribers``: every stage instance (their snapshot parts are
    collected); ``relays``: where watermarks and markers go instead, when acker shards pass them
    on to their instances (:class:`.acker_shard.AckShardHost`), ``relay_of(instance)`` the one
    that passes on to ``instance`` (a recovery's frontier for it alone); ``aligned``:
    ``(instance, group)`` of the source instances told their group's frontier, or None;
    ``table``: the acker's tables (default: one :class:`~driftstream.ordering.acker.Acker`
    over ``sources``; ``recovery="local"``: a :class:`~driftstream.ordering.channel_tables.ChannelAcker`).
    """

    def __init__(self, sources: int, send: Callable[[Any, Any], None], defer: Callable[[Callable[[], None]], None] = at_once,
                 finish: Optional[Callable[[tuple], None]] = None, subscribers: Optional[list] = None,
                 aligned: Optional[list] = None, relays: Optional[list] = None, table: Optional[Acker] = None,
                 relay_of: Optional[Callable[[Any], Any]] = None) -> None:
        self.table = Acker(sources) if table is None else table
        self._send, self._defer, self._finish = send, defer, finish
        self.subscribers: list = list(subscribers or [])
        self.relays = relays
        #: with ``relays``: the one of them that passes messages on to a given instance
        self.relay_of = relay_of
        self.aligned = aligned
        #: the watermark last pushed to the subscribers
        self.pushed = self.table.watermark
        self.frontier_told: dict = {}
        self.push_scheduled = self.align_scheduled = False
        #: flushes folded, and the times they held (a shard's batch: its net times), for the figures
        self.updates = self.entries = 0
        # snapshot id -> (its PartCollector, called once every part is in), while it is taken
        self.pending: dict = {}
        #: recovery="local": while an instance recovers, the frontier each instance is told
        #: (ordering/receiver_frontiers.py); None: the one watermark goes to all
        self.frontiers: Optional[ReceiverFrontiers] = None

    def seed(self, xors: dict) -> None:
        """Restored windows' timers, in the table before any source starts."""
        self.table.update(xors)

    def receive(self, message: Any) -> None:
        """A stage instance's ``Ack`` (XORs, a source's bound) or ``Prepared`` part, or an acker
        shard's ``ShardFlush`` (:class:`.acker_shard.AckShardHost`)."""
        kind = type(message)
        if kind is Prepared:
            pending = self.pending.get(message.snapshot_id)
            if pending is not None:  # else: a snapshot given up on (a reset or a crash since)
                collector, complete = pending
                if collector.add(message.instance, message.part):
                    complete(collector)
            return
        if kind is ShardFlush:  # a shard's batch of whole flushes (ordering/ack_shards.py)
            self.table.update_many(message.xors, message.bounds)
            self.updates += message.flushes
            self.entries += len(message.xors)
            bounded = bool(message.bounds)
        else:
            self.table.update(message.xors, message.source_index, message.bound)
            self.updates += 1
            self.entries += len(message.xors)
            bounded = message.bound is not None
        if (self.table.watermark > self.pushed or self.frontiers is not None) and not self.push_scheduled:
            self.push_scheduled = True
            self._defer(self._push)
        if kind is ShardFlush:
            for part in message.parts:
                self.receive(part)
        if bounded and self.aligned is not None and not self.align_scheduled:
            self.align_scheduled = True
            self._defer(self._align)

    def _push(self) -> None:
        self.push_scheduled = False
        if self.frontiers is not None and self._push_each():
            return
        w = self.table.watermark
        if w <= self.pushed:
            return
        self.pushed = w
        if w == TOP and self._finish is not None:
            self._finish(w)
            return
        for key in self._watermark_receivers:
            self._send(key, Watermark(w))

    def diverge(self, frontiers: ReceiverFrontiers) -> None:
        """recovery="local": an instance failed; until ``frontiers`` is done each instance is
        told its own frontier (straight to it, not through relays), and no marker may go."""
        self.frontiers = frontiers
        self.push_soon()

    def push_soon(self) -> None:
        """Push what is due (after a replacement caught up: the recovery's frontiers may end)."""
        if not self.push_scheduled:
            self.push_scheduled = True
            self._defer(self._push)

    def _push_each(self) -> bool:
        """Tell each instance its frontier if it moved; False once the recovery's frontiers are
        over (the one watermark goes out then: it is at or past every frontier told)."""
        frontiers = self.frontiers
        for key, t in frontiers.due():
            if self.relays is None:
                self._send(key, Watermark(t))
            else:  # behind what its shard still has to pass on to it
                self._send(self.relay_of(key), Told(key, t))
        if frontiers.done:
            self.frontiers = None
            return False
        return True

    @property
    def _watermark_receivers(self) -> list:
        """Where a watermark or a snapshot's marker goes: every instance, or the shards that relay it."""
        return self.subscribers if self.relays is None else self.relays

    def _align(self) -> None:
        """Tell the aligned source instances their group's frontier, if it moved."""
        self.align_scheduled = False
        told = self.frontier_told
        for group in dict.fromkeys(g for _, g in self.aligned):
            frontier = self.table.frontier(group)
            if frontier > told.get(group, BOTTOM):
                told[group] = frontier
                for key, g in self.aligned:
                    if g == group:
                        self._send(key, Align(frontier))

    def begin_snapshot(self, snapshot_id: int, complete: Callable[[PartCollector], None] = lambda c: None) -> PartCollector:
        """Send the marker of snapshot ``snapshot_id`` at the table's watermark to every
        subscriber (after every earlier watermark: one FIFO connection each) and collect the
        parts; ``complete(collector)`` once every part is in."""
        collector = PartCollector(snapshot_id, self.table.watermark, self.subscribers)
        self.pending[snapshot_id] = (collector, complete)
        for key in self._watermark_receivers:
            self._send(key, Watermark(collector.t, snapshot_id))
        return collector

    def end_snapshot(self, snapshot_id: int) -> Optional[PartCollector]:
        """Stop collecting snapshot ``snapshot_id`` (committed, or given up on); its collector."""
        pending = self.pending.pop(snapshot_id, None)
        return None if pending is None else pending[0]

    @property
    def collecting(self) -> Optional[PartCollector]:
        """The newest snapshot being collected (None: none is)."""
        return next(reversed(self.pending.values()))[0] if self.pending else None

    def status(self) -> dict:
        """The figures ``FlowHandle.status()`` shows of the acker."""
        table = self.table
        return {"watermark": table.watermark, "in_flight": table.in_flight(), "updates": self.updates, "entries": self.entries, "settled": table.settled(),
                "bounds": list(table.bounds)}
