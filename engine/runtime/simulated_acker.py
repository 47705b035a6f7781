"""The acker's side of one incarnation of a simulated run (:mod:`.simulator`): its table,
the watermark it pushed, the frontiers it told aligned sources, and the snapshot whose
parts it is collecting. On Ray the acker actor and the supervisor play these parts.

>>> from driftstream.engine.model.plan import Instance
>>> from driftstream.engine.runtime.protocol import Ack
>>> sent = []
>>> acker = SimulatedAcker(sources=1, aligned=None, send=lambda to, message: sent.append((to, message)))
>>> acker.receive(Ack({}, 0, (5, 0, 0, 5)), [Instance(0, 0)])     # the source emitted up to t=(5, 0, 0, 5)
>>> acker.watermark, sent                                          # everything before the next time is complete
((5, 0, 0, 6), [(Instance(stage=0, index=0), Watermark(t=(5, 0, 0, 6), snapshot_id=None))])
>>> acker.begin_snapshot(1, [Instance(0, 0)]); sent[-1][1], acker.collector.missing
(Watermark(t=(5, 0, 0, 6), snapshot_id=1), [Instance(stage=0, index=0)])

Costs: :meth:`receive` is the acker's update (O(times in the message)) plus, for a
bound, one frontier per group of aligned sources.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import BOTTOM

from driftstream.engine.model.manifest import PartCollector
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.protocol import Align, Prepared, Watermark


class SimulatedAcker:
    """The acker of one incarnation; ``send(instance, message)`` queues a control message
    for a stage instance. ``aligned``: ``(instance, group)`` of the sources told frontiers
    (:func:`~driftstream.engine.model.config.aligned_sources`), or None."""

    def __init__(self, sources: int, aligned: Optional[list], send: Callable[[Instance, Any], None]) -> None:
        self.table = Acker(sources=sources)
        self.watermark = self.table.watermark
        self.aligned = aligned
        self.frontier_told: dict = {}
        #: the parts of the snapshot being taken (None: none is)
        self.collector: Optional[PartCollector] = None
        self._send = send

    def seed(self, xors: dict) -> None:
        """Restored windows' timers, in the table before any source starts."""
        self.table.update(xors)

    def receive(self, message: Any, instances: Iterable[Instance]) -> None:
        """An instance's ``Ack`` (XORs, a source's bound) or ``Prepared`` part. A new watermark
        goes to every one of ``instances``; a bound may move an aligned group's frontier."""
        if type(message) is Prepared:
            if self.collector is not None and self.collector.snapshot_id == message.snapshot_id:
                self.collector.add(message.instance, message.part)
            return
        w = self.table.update(message.xors, message.source_index, message.bound)
        if w != self.watermark:
            self.watermark = w
            for instance in instances:
                self._send(instance, Watermark(w))
        if message.bound is not None and self.aligned is not None:
            for group in dict.fromkeys(g for _, g in self.aligned):
                frontier = self.table.frontier(group)
                if frontier > self.frontier_told.get(group, BOTTOM):
                    self.frontier_told[group] = frontier
                    for instance, g in self.aligned:
                        if g == group:
                            self._send(instance, Align(frontier))

    def begin_snapshot(self, snapshot_id: int, instances: list) -> None:
        """The marker of snapshot ``snapshot_id`` at the current watermark, to every instance."""
        self.collector = PartCollector(snapshot_id, self.watermark, instances)
        for instance in instances:
            self._send(instance, Watermark(self.watermark, snapshot_id))

    def take_collected(self) -> PartCollector:
        """The snapshot's parts, every one in: the supervisor commits them."""
        collected, self.collector = self.collector, None
        return collected
