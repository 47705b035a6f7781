"""The operator of a stateless step declared ``deterministic=False``: the step's own operator
(a map, flat_map, filter or a batch form, perhaps dead-lettering) behind its output log
(:class:`~driftstream.snapshots.output_log.OutputLog`).

An element logged before a restore gets its logged outputs back, the function not called; any
other is computed and its outputs recorded, for the instance to write before it acknowledges
the element (:mod:`.output_logs`). A tombstone takes back exactly what its element gave here:
recomputed, a function that is not deterministic would retract other payloads than those it
emitted, which a ``key_by`` after it would route to another key.

>>> from driftstream.engine.runtime.operators import Map
>>> from driftstream.snapshots.output_log import OutputLog
>>> draws = iter([0.25, 0.75])
>>> op = LoggedStep(Map("noisy", lambda x: x + next(draws)), OutputLog(), flat=False)
>>> m = (1, 0, 0, 1, (), False)
>>> op.run([(m, 1, None)]), op.run([((1, 0, 0, 1, (), True), 1, None)])
([((1, 0, 0, 1, (), False), 1.25, None)], [((1, 0, 0, 1, (), True), 1.25, None)])
>>> op.log.replay[m] = [(m, 1.25, None)]; op.run([(m, 1, None)])  # as after a restore: logged, not drawn again
[((1, 0, 0, 1, (), False), 1.25, None)]

Costs: one dict lookup and one record per element, and the wrapped operator's own run over the
elements it computes (one call for all of them, as without the log). With replicas, ``replica``
(:class:`~.replica_draws.ReplicaDraws`) runs it instead: the primary draws, the others take its draws.
"""

from __future__ import annotations

from driftstream.ordering.meta import tombstone_of
from driftstream.snapshots.output_log import OutputLog

from driftstream.engine.runtime.operators import Operator


class LoggedStep(Operator):
    """``inner`` (the step's operator) whose outputs per input go through ``log``; ``flat``: an
    output's parent is its Meta without its last child id (a flat map's), else its own Meta."""

    __slots__ = ("inner", "log", "flat", "replica")

    def __init__(self, inner: Operator, log: OutputLog, flat: bool) -> None:
        super().__init__(inner.name)
        self.inner, self.log, self.flat = inner, log, flat
        #: replicas > 1: this replica's side of the draws (None: the step's instance has no replicas)
        self.replica = None

    def run(self, items: list) -> list:
        if self.replica is not None:
            return self.replica.run(self, items)
        log = self.log
        replay = log.replay
        fresh = [item for item in items if not item[0][5] and item[0] not in replay]
        computed = self._by_parent(fresh) if fresh else {}
        out: list = []
        for item in items:
            meta = item[0]
            if meta[5]:  # a tombstone: what its element gave here, as tombstones
                given = log.retract(meta[:5] + (False,))
                if given is None:  # its element went through before this incarnation's log: compute
                    out.extend(self.inner.run([item]))
                else:
                    out.extend((tombstone_of(m), p, k) for m, p, k in given)
                continue
            logged = replay.get(meta)
            outputs = (computed[meta].pop(0) if meta in computed else []) if logged is None else logged
            log.record(meta, outputs, fresh=logged is None)
            out.extend(outputs)
        return out

    def _by_parent(self, items: list) -> dict:
        """Per input Meta, the outputs of its items in order (a list per item), computed in one
        run of the inner operator; one run per item if two share a Meta (an element, its
        tombstone and its new version in one batch), whose outputs could not be told apart."""
        if len({item[0] for item in items}) < len(items):
            by_item: dict = {}
            for item in items:
                by_item.setdefault(item[0], []).append(self.inner.run([item]))
            return by_item
        grouped: dict = {item[0]: [[]] for item in items}
        flat = self.flat
        for triple in self.inner.run(items):
            m = triple[0]
            grouped[(m[0], m[1], m[2], m[3], m[4][:-1], m[5]) if flat else m][0].append(triple)
        return grouped

    def settle(self, watermark: tuple) -> None:
        self.log.settle(watermark)
        if self.replica is not None:
            self.replica.settle(watermark)
