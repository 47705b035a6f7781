"""The stage and acker actors' parts in a replacement replica on Ray (``replicas=r``, issue 58,
design item 4), mixed into :class:`~.actors.StageActor` and :class:`~.actors.AckerActor`;
:mod:`driftstream.engine.control.replica_replacement` calls them in order. What the simulator
does alike is :mod:`.replica_replacements`.

- The acker (:meth:`ReplacementAckerSide.replica_joining`) sets the new replica's incarnation
  aside (its channels, timers and holds out of the one watermark: its backlog would stop
  every instance's output; it is told its own frontier,
  :meth:`~driftstream.ordering.channel_tables.ChannelAcker.frontier_of`), holds the restored
  snapshot's ``T`` for it until each sender's ReplaySent, and once it caught up
  (:meth:`_replica_caught_up`) adds it to the instance's replicas: it is told watermarks (and
  under ``"majority"`` markers) as any replica, and votes from the next epoch.
- Every stage actor (:meth:`ReplacementStageSide.replica_added`) adds it to the instance's live
  replicas (its fan-out); a sender whose stream the replicas take (a primary, or an instance
  without replicas) first re-sends from its log what it sent the instance at or after ``T``, to
  the new replica's channel alone, then its ReplaySent.

>>> sorted(m for m in vars(ReplacementStageSide) if not m.startswith("_")), sorted(m for m in vars(ReplacementAckerSide) if not m.startswith("_"))
(['replica_added', 'replica_epochs'], ['replica_adopt', 'replica_joined', 'replica_joining'])
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from driftstream.ordering.meta import BOTTOM

from driftstream.engine.model.manifest import Instance
from driftstream.engine.runtime.protocol import GateOpen, Push, ReplaySent
from driftstream.engine.runtime.replicas import address


class ReplacementAckerSide:
    """An :class:`~.actors.AckerActor`'s part in a replacement replica (its ``host``, ``endpoint``,
    ``catching_up``, ``incarnations``, ``replica_sets`` and ``votes`` are the actor's):
    ``joining``: the replica address of each replacement catching up -> ``(instance, event set
    once it joined)``; ``joined_at``: incarnation -> wall time it joined."""

    async def replica_joining(self, victim: tuple, inc: Any, where: tuple, tokens: list, t: tuple) -> tuple:
        """Replica ``inc`` of instance ``victim`` (listening at ``where``) restores snapshot ``t``;
        each of ``tokens`` (its senders' ReplaySent) holds ``t`` for it, and so does its own until
        :meth:`replica_adopt`. Returns ``(None, the votes' epoch ends so far)`` (``"majority"``;
        else ``[]``), or, changing nothing, ``(why, None)`` when it cannot join now (a failover
        or recovery under way, the run ending: :meth:`replica_refusal`)."""
        key = address(inc)
        await self.endpoint.connect(key, where)
        why = await self.replica_refusal()  # after the last await: nothing may change between the answer and the holds
        if why is not None:
            return why, None
        table = self.host.table
        table.set_aside(inc)
        for token in tokens:
            table.hold((inc, token), t)
        table.hold((inc, key), t)
        self.incarnations[key] = inc
        self.catching_up[key] = BOTTOM  # also: no snapshot begins until it caught up (its marker would pass it)
        self.joining[key] = (Instance(*victim), asyncio.Event())
        return None, [] if self.votes is None else [end for _, end in self.votes.ends if end is not None]

    async def replica_adopt(self, inc: Any, seed: dict) -> None:
        """The timers replica ``inc`` restored (``seed``) enter the table; then its own hold goes."""
        if seed:
            self.host.seed(seed)
        self._on_local_message(ReplaySent(inc, address(inc)))

    async def replica_joined(self, inc: Any) -> float:
        """Wall time replica ``inc`` caught up and joined its instance's replicas (waits for it)."""
        joining = self.joining.get(address(inc))
        if joining is not None:
            await joining[1].wait()
        return self.joined_at[inc]

    def _replica_caught_up(self, key: tuple) -> None:
        """The replacement at ``key`` met the watermark: a replica as any other from now on."""
        victim, event = self.joining.pop(key)
        inc = key[1]
        self.replica_sets[victim].append(inc)
        if self.votes is not None:  # it votes on the epochs that end from now on, and learns how far the gate is open
            self.votes.joined(victim, inc)
            self.endpoint.send(key, GateOpen(self.gate_told))
        self.joined_at[inc] = time.time()
        event.set()


class ReplacementStageSide:
    """A :class:`~.actors.StageActor`'s part in a replacement replica (its ``host``, ``endpoint``,
    ``replica_sets``, ``voter``, ``send`` and ``batch_size`` are the actor's)."""

    async def replica_added(self, victim: tuple, inc: Any, where: Optional[tuple], t: tuple, replay: bool) -> int:
        """Replica ``inc`` of instance ``victim``, restored at ``t``, joins its fan-out (``where``:
        its address, when this actor's stage sends to it). ``replay``: this actor's stream is the
        one the replicas take: it re-sends from its log what it sent ``victim`` at or after ``t``,
        to ``inc``'s channel alone, then its ReplaySent. Returns the items re-sent."""
        victim = Instance(*victim)
        to = address(inc)
        if where is not None:
            await self.endpoint.connect(to, where)
        host = self.host
        if not host.failed:
            host.flush()  # what it holds for the instance goes to the others (logged: in the replay below)
        self.replica_sets[victim].append(inc)
        if where is not None and victim == self.key and host.draws is not None:  # its primary: every draw it holds (replica_draws.py)
            host.draws.sync(to)
        if not replay:
            return 0
        part = host.recovery
        replayed = part.replayed
        for _, batch in part.replay(host.rt, victim, inc, self.batch_size, since=t):
            self._send(to, Push(batch))
        host.flush()  # the replay's holds reach the acker before its ReplaySent
        self.send("acker", ReplaySent(inc, self.key))
        return part.replayed - replayed

    async def replica_epochs(self, ends: list) -> None:
        """``verify="majority"``, a replacement: the epochs' ends so far (its digests are cut there)."""
        for t in ends:
            self.voter.epochs.add(t)
