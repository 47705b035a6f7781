"""One incarnation's side of local recovery (``recovery="local"``, issue 58), written once for
the simulator and Ray: what it sent since the last committed snapshot (its
:class:`~driftstream.ordering.upstream_log.UpstreamLog`), what it took above its watermark
by sender (:class:`~driftstream.ordering.unsettled_inputs.UnsettledInputs`), the cut below
which a replacement drops its own output, its acks tagged by channel, and its part when a
peer fails (:meth:`InstanceRecovery.peer_failed`). :class:`~.instance_host.InstanceHost`
calls the hooks; the run (:mod:`.local_recovery` in the simulator, the supervisor on Ray)
says when a peer failed.

>>> from driftstream.engine.runtime.outbound import ChannelBatch
>>> part = InstanceRecovery({(0, 0): 1, (1, 0): 2}, (0, 0))
>>> item = ((3, 0, 0, 3, (), False), "x", None)
>>> part.sent((1, 0), ChannelBatch(1, 7, [(3, 0, 0, 3)], [item], (0, 0), False, (1, 2)), {}) is not None
True
>>> part.tag({(3, 0, 0, 3): 5})                 # its own timers: the table of its channel to itself
{((1, 1), (3, 0, 0, 3)): 5}
>>> part.cut = (4, 0, 0, 0)                     # a replacement: its output below the cut is dropped (still logged)
>>> part.sent((1, 0), ChannelBatch(1, 9, [(3, 0, 0, 3)], [item], (0, 0), False, (1, 2)), acks := {}), acks, len(part.log)
(None, {((1, 2), (3, 0, 0, 3)): 9}, 2)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from driftstream.ordering.unsettled_inputs import UnsettledInputs
from driftstream.ordering.upstream_log import UpstreamLog

from driftstream.engine.runtime.outbound import ChannelBatch
from driftstream.engine.runtime.protocol import Ack, Watermark


class InstanceRecovery:
    """Incarnation ``incarnations[key]`` of instance ``key``: ``incarnations`` (instance ->
    its current incarnation) is the run's, shared with the runtime's
    :class:`~.outbound.ChannelOutbound`. ``cut``: set on a replacement (the watermark when its
    predecessor failed); ``replayed``/``cancelled``: items re-sent and undone over its life.
    ``own``: its incarnation when it is not ``incarnations[key]`` (a replica that is not the
    primary; see simulated_replicas.py)."""

    def __init__(self, incarnations: dict, key: Any, own: Any = None) -> None:
        self.incarnations, self.key = incarnations, key
        #: its own incarnation, fixed for its life (a replacement is a new InstanceRecovery)
        self.own = incarnations[key] if own is None else own
        self.log, self.inputs = UpstreamLog(), UnsettledInputs()
        self.cut: Optional[tuple] = None
        self.replayed = self.cancelled = 0

    def sent(self, to: tuple, batch: ChannelBatch, acks: dict) -> Optional[ChannelBatch]:
        """This instance sends ``batch`` to ``to``: logged; a replacement's items below its cut
        dropped (the receivers have them). None: nothing left, the batch's hold undone in
        ``acks`` (its own, not yet flushed)."""
        self.log.record(to, batch.entry, batch.items)
        cut = self.cut
        if cut is None:
            return batch
        kept = [item for item in batch.items if not item[0] < cut]
        if len(kept) == len(batch.items):
            return batch
        if kept:
            return dataclasses.replace(batch, items=kept)
        acks[(batch.channel, batch.times[0])] = acks.get((batch.channel, batch.times[0]), 0) ^ batch.batch_id
        return None

    def received(self, batch: Any) -> None:
        """It takes ``batch``: remembered by sender until its watermark passes it."""
        self.inputs.record(batch.sender, batch.entry, batch.items)

    def settled(self, t: tuple) -> None:
        """Its watermark reached ``t``: what it took below is settled, never cancelled."""
        self.inputs.settle(t)

    def tag(self, xors: dict) -> dict:
        """Its flush's XORs with its own (timers: keyed by time alone) put in the table of its
        channel to itself."""
        own = self.own
        me = (own, own)
        return {(k if type(k[0]) is tuple else (me, k)): x for k, x in xors.items()}

    def tagged(self, message: Any) -> Any:
        """Its message for the acker: an :class:`Ack`'s XORs tagged (:meth:`tag`) and its source
        index paired with the incarnation (a bound of a dead one, come late, is dropped)."""
        if type(message) is Ack:
            own = self.own
            return Ack(self.tag(message.xors), None if message.source_index is None else (message.source_index, own), message.bound)
        return message

    def trim(self, t: tuple) -> None:
        """Snapshot ``t`` committed: a restore starts there, the log keeps what is at or after it."""
        self.log.trim(t)

    def peer_failed(self, host: Any, victim: tuple, new: Any, cut: tuple, batch_size: int, replay: bool = True,
                    since: Optional[tuple] = None) -> list:
        """Peer ``victim`` failed, its replacement is incarnation ``new`` (already in
        ``incarnations``): ``host`` (its :class:`~.instance_host.InstanceHost`) processes what
        its input merge held back (of the dead sender too: their holds were discarded), cancels
        what the dead incarnation sent it at or above ``cut``, and returns the batches it
        re-sends from its log, ``(victim, ChannelBatch)``, their holds XORed into its acks. The
        caller sends them, flushes, then sends the acker :class:`~.protocol.ReplaySent`.
        ``replay`` False: ``new`` is a replica already caught up (nothing re-sent); ``since``: what
        ``new`` restores, the least time re-sent (None: the whole log)."""
        if host.rt.holding:
            host.guarded(host.rt.release_held, True)
        for entry, items in self.inputs.cancel(victim, cut).items():
            self.cancelled += len(items)
            host.guarded(host.rt.process, entry, items)
        return self.replay(host.rt, victim, new, batch_size, since) if replay else []

    def replay(self, rt: Any, victim: tuple, new: Any, size: int, since: Optional[tuple] = None) -> list:
        """What it logged for ``victim`` (at or after ``since``, if given), as new batches of its
        channel to incarnation ``new`` (at most ``size`` items each), their holds XORed into
        ``rt``'s acks."""
        channel = (self.own, new)
        out = []
        for entry, items in self.log.replay(victim).items():
            if since is not None:
                items = [item for item in items if not item[0] < since]
            self.replayed += len(items)
            for i in range(0, len(items), size):
                chunk = items[i:i + size]
                bid = rt.rng.getrandbits(64) or 1
                least = min(item[0] for item in chunk)[:4]
                rt.acks.xor((channel, least), bid)
                out.append((victim, ChannelBatch(entry, bid, [least], chunk, self.key, False, channel)))
        return out


def catch_up(table: Any, catching_up: dict, incarnations: dict, pushed: tuple, send: Callable[[Any, Any], None]) -> list:
    """The acker's side: tell each replacement catching up (``catching_up``: instance -> the
    watermark it was told) the raw frontier of ``table`` if it moved (a replica's set aside:
    :meth:`~driftstream.ordering.channel_tables.ChannelAcker.frontier_of`); one whose frontier met
    the watermark the others were told (``pushed``), with no replay pending, has caught up (a
    replica's channels join the watermark). Returns those that caught up."""
    caught = []
    for instance, told in list(catching_up.items()):
        own = incarnations[instance]
        raw = table.frontier_of(own)
        if raw > told:
            catching_up[instance] = raw
            send(instance, Watermark(raw))
        if raw >= pushed and not any(token[0] == own for token in table.holds):
            del catching_up[instance]
            table.join(own)
            caught.append(instance)
    return caught
