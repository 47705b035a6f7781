"""The stage and acker actors' parts under ``replicas=r`` (``verify="first"``; issue 58, design
item 4), mixed into :class:`~.actors.StageActor` and :class:`~.actors.AckerActor`: the fan-out
of batches and the acker's messages to every replica, a replica that is not the primary keeping
its sinks' bundles, and each actor's part when a replica dies
(:mod:`driftstream.engine.control.replica_failover` calls them in order). What the simulator
does alike is :mod:`.replicas`; with ``replicas=1`` nothing here runs.

>>> sorted(m for m in vars(ReplicaStageSide) if not m.startswith("_")), sorted(m for m in vars(ReplicaAckerSide) if not m.startswith("_"))
(['promote', 'replica_failed'], ['replica_failed', 'replica_refusal'])
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from driftstream.engine.model.manifest import Instance
from driftstream.engine.runtime.protocol import Ack, Push, ReplaySent
from driftstream.engine.runtime.replicas import address, fan_out_copies, for_replica, promote


class ReplicaStageSide:
    """A :class:`~.actors.StageActor`'s replica methods (its ``replica_sets``, ``kept``, ``send``,
    ``host``, ``endpoint`` and ``lost`` are the actor's)."""

    async def replica_failed(self, victim: tuple, old: Any, new: Any, cut: Optional[tuple], name: str) -> dict:
        """Replica ``old`` of instance ``victim`` (actor ``name``) died. ``new`` None: it was not the
        primary, it leaves the fan-out and nothing else. Else it was, and replica ``new`` is the
        primary from the cut on: this instance's part (:meth:`InstanceHost.peer_failed` with
        nothing re-sent; its batches to ``victim`` go to ``new`` from now on). Returns the items
        cancelled."""
        victim = Instance(*victim)
        live = None if self.replica_sets is None else self.replica_sets.get(victim)
        if live is not None and old in live:
            live.remove(old)  # before the flush below: what it holds for the dead one goes to the others too
        self._forget(name)
        part = self.host.recovery
        if new is None or part is None:
            return {"cancelled": 0}
        cancelled = part.cancelled
        self.drain.drop_from(victim)
        sends = live is not None and address(new) in self.endpoint.writers
        self.host.peer_failed(victim, new, cut, self.batch_size, reconnect=lambda: sends and self.endpoint.adopt(victim, address(new)),
                              replay=False)
        return {"cancelled": part.cancelled - cancelled}

    async def promote(self, old: Any, cut: tuple, name: str) -> dict:
        """This replica becomes its instance's primary at watermark ``cut`` (the dead primary,
        incarnation ``old``, actor ``name``): what it kept that the sinks lack is written, what it produced at or
        above the cut is sent again (the receivers cancelled the dead primary's), then its
        ReplaySent. Returns the items re-sent."""
        host = self.host
        for sink, bundle in promote(host, self.kept.bundles):  # before anything it releases from now on
            sink.write(bundle)
        self.kept = None
        self._forget(name)
        part = host.recovery
        part.incarnations[self.key] = part.own
        self.replica_sets[self.key].remove(old)
        replayed = part.replayed
        for to in list(part.log.items):
            for _, batch in part.replay(host.rt, to, part.incarnations[to], self.batch_size, since=cut):
                self.send(to, Push(batch))
        host.flush()
        self.send("acker", ReplaySent(part.own, self.key))
        return {"replayed": part.replayed - replayed}

    async def _connect_replicas(self, replicas: dict, downstream: set) -> None:
        """``replicas``: incarnation -> ``(instance, address)`` of each replica that is not the
        primary; those of ``downstream`` stages are connected."""
        for inc, (key, where) in replicas.items():
            if key[0] in downstream:
                await self.endpoint.connect(address(inc), where)

    def _forget(self, name: str) -> None:
        """The death of peer ``name`` is answered: its connection's end, seen late, is not a new one."""
        self.lost = type(self.lost)(self.lost.ignore | {name})
        self.endpoint.on_lost = self.lost.add

    def _send_to_replicas(self, to: Any, message: Any) -> None:
        """replicas > 1: :meth:`_send`, a batch for a replicated instance to each live replica
        (runtime/replicas.py), a replica's ReplaySent named by its incarnation."""
        kind = type(message)
        if kind is Push:
            live = self.replica_sets.get(to)
            if live is not None:
                for inc, copy in fan_out_copies(message.batch, live, self.rt.acks):
                    self._send(address(inc), Push(copy))
        elif kind is ReplaySent and self.key in self.replica_sets:
            message = ReplaySent(message.receiver, address(self.host.recovery.own))
        self._send(to, message)

    def _keep_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        """A replica that is not the primary keeps what its sinks release (taken as written)."""
        if self.kept is None:  # promoted since
            return self._write_bundle(sid, sink, bundle)
        self.kept.keep(sink, bundle)
        asyncio.get_running_loop().call_soon(self._bundle_written, self.host, sid, bundle, None)


class ReplicaAckerSide:
    """An :class:`~.actors.AckerActor`'s replica methods: ``replica_sets`` (replicated instance ->
    its live replicas' incarnations, the primary first) and what a replica's death does."""

    async def _connect_replicas(self, replicas: dict) -> None:
        """``replicas``: replicated instance -> ``[(incarnation, address)]``, the primary (a
        subscriber, connected already) first."""
        for key, listed in replicas.items():
            self.replica_sets[Instance(*key)] = [inc for inc, _ in listed]
            for inc, where in listed[1:]:
                await self.endpoint.connect(address(inc), where)

    def _tell_replicas(self, to: Any, message: Any) -> None:
        """What the primary of ``to`` was told, to its other replicas (a marker as a watermark)."""
        replicas = self.replica_sets.get(to)
        if replicas is not None:
            for inc in replicas[1:]:
                self.endpoint.send(address(inc), for_replica(message, False))

    async def replica_failed(self, victim: tuple, old: Any, name: str, tokens: Optional[list], handle: Any = None) -> Optional[tuple]:
        """Replica ``old`` of instance ``victim`` (actor ``name``) died; its tables go (and its ReplaySent's holds).
        ``tokens`` None: it was not the primary, nothing else. Else the next replica (``handle``)
        is the primary from the cut, the watermark now, which is returned: the snapshot being
        collected is given up (the dead primary's part may be lost), and each of ``tokens`` (every
        live instance's and replica's ReplaySent, the new primary's too) holds the cut until it
        comes."""
        victim = Instance(*victim)
        table, replicas = self.host.table, self.replica_sets[victim]
        primary = replicas[0] == old
        replicas.remove(old)
        cut = None
        if primary:
            self._end_schedule()
            if self.collecting is not None:
                self.collecting.set()
            cut = table.watermark
            new = replicas[0]
            for token in tokens:
                table.hold((new, token), cut)
            self.endpoint.adopt(victim, address(new))  # its watermarks, and markers, to the new primary
            self.subscribers[victim] = handle
            self.incarnations[victim] = new
        table.discard(old)
        # Its own ReplaySent died with it. Released only now: a release recomputes the watermark,
        # which must not pass the cut before the new holds are in.
        for token in [k for k in table.holds if k[1] == address(old)]:
            table.release(token)
        self.lost = type(self.lost)(self.lost.ignore | {name})  # the dead one's connection ended: seen, answered
        self.endpoint.on_lost = self.lost.add
        self.host.receive(Ack({}, None, None))  # the watermark a released hold kept back is pushed
        return cut

    async def replica_refusal(self, ignore: tuple = ()) -> Optional[str]:
        """replicas > 1: why a replica's death cannot fail over now (None: it can); ``ignore``: the
        ReplaySent tokens of replicas that died meanwhile (theirs go with their own failover)."""
        if any(token[1] not in ignore for token in self.host.table.holds):
            return "a failover or recovery was still under way"  # its re-sends not all in: the cut would be wrong
        return await self.local_refusal()
