"""The stage and acker actors' parts under ``recovery="local"`` (issue 58, design item 3),
mixed into :class:`~.actors.StageActor` and :class:`~.actors.AckerActor`: the acker's cut,
holds and frontiers when one instance fails and its replacement's adoption; a surviving
instance's switch to the replacement and its replay. :mod:`driftstream.engine.control.local_failover`
calls them in order; what the simulator does alike is :mod:`.local_recovery` and
:mod:`.instance_recovery`. Under ``recovery="global"`` nothing here runs.

>>> sorted(m for m in vars(LocalStageSide) if not m.startswith("_")), sorted(m for m in vars(LocalAckerSide) if not m.startswith("_"))
(['peer_failed', 'trim_sent'], ['adopt', 'local_fail', 'local_refusal'])
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.ordering.meta import BOTTOM, TOP
from driftstream.ordering.receiver_frontiers import Cones, ReceiverFrontiers

from driftstream.engine.model.manifest import Instance
from driftstream.engine.runtime.instance_recovery import catch_up
from driftstream.engine.runtime.lost_peers import LostPeers
from driftstream.engine.runtime.protocol import Ack, ReplaySent


class LocalAckerSide:
    """An :class:`~.actors.AckerActor`'s local-recovery methods (its ``host``, ``endpoint``,
    ``lost``, ``catching_up``, ``incarnations``, ``subscribers`` and ``source_keys`` are the
    actor's)."""

    def _on_local_message(self, message: Any) -> None:
        """An instance's message under ``recovery="local"``: a :class:`ReplaySent` ends its hold;
        then each replacement catching up is told the frontier if it moved."""
        host = self.host
        if type(message) is ReplaySent:
            host.table.release((message.receiver, message.sender))
            message = Ack({}, None, None)  # the watermark the hold kept back is pushed
        host.receive(message)
        if self.catching_up:
            # Against the table's watermark, not the one last pushed (pushes are deferred here).
            for key in catch_up(host.table, self.catching_up, self.incarnations, host.table.watermark, self.endpoint.send):
                if key in self.joining:  # a replacement replica (replica_replacement_actors.py)
                    self._replica_caught_up(key)
        if host.frontiers is not None:
            host.push_soon()  # a replacement that caught up may end the recovery's frontiers

    async def local_fail(self, victim: tuple, old: Any, new: Any, survivors: list, t: tuple, incarnations: Optional[dict] = None,
                         cones: Optional[Cones] = None, name: str = "", replicas: bool = False) -> tuple:
        """Instance ``victim``'s incarnation ``old`` died; ``new`` restores snapshot ``t``:
        the snapshot being collected is given up (its part may be lost), the schedule ends, the
        dead incarnation's tables go (and its source's bound), and each of ``survivors`` holds
        ``t`` until its ReplaySent. With ``cones`` (the plan's) and ``incarnations`` (every
        instance's, the replacement's included), and the replacement holds ``t`` until :meth:`adopt`,
        each instance is then told its own frontier
        until the recovery is over (ordering/receiver_frontiers.py). Returns ``(the cut, None)``:
        the watermark now; or, changing nothing, ``(None, why)`` when the failure cannot be
        recovered locally now (:meth:`local_refusal`; ``replicas``: :meth:`replica_refusal`),
        asked in the same call: nothing may change in between. ``name``: the dead one's on the
        data plane (its connection's end, seen late, is not a new death)."""
        why = await (self.replica_refusal() if replicas else self.local_refusal())
        if why is not None:
            return None, why
        victim = Instance(*victim)
        self._end_schedule()
        if self.collecting is not None:
            self.collecting.set()  # _snapshot returns it with the parts it has: missing ones end the schedule
        table = self.host.table
        cut = table.watermark
        table.discard(old)
        if victim in self.source_keys:  # its replacement re-reads from t: its bound is unknown again
            table.reset_bound(self.source_keys.index(victim))
        for key in survivors:
            table.hold((new, Instance(*key)), t)
        # and its own, until adopt() has its restored timers: the survivors' parts need not wait for that call
        table.hold((new, victim), t)
        self.incarnations[victim] = new
        # Told nothing yet, not T: a restored window's timer at T holds the frontier at T, and
        # fires only once the replacement is told T itself.
        self.catching_up[victim] = BOTTOM
        if cones is not None:  # the others are told their own frontiers until the replacement's downstream is back with them
            owners = {inc: Instance(*key) for key, inc in incarnations.items()}
            self.host.diverge(ReceiverFrontiers(table, cones, victim, owners, self.source_keys, self.host.pushed, self.catching_up))
        self.lost = LostPeers(self.lost.ignore | {name})  # the dead one's connection ended: seen, answered
        self.endpoint.on_lost = self.lost.add
        return cut, None

    async def adopt(self, victim: tuple, handle: Any, address: tuple, seed: dict) -> None:
        """The replacement of ``victim`` listens at ``address``: watermarks go to it (its frontier
        while it catches up); its restored windows' timers, ``seed``, enter the table, then its
        hold from :meth:`local_fail` goes (the survivors' parts may come before or after)."""
        victim = Instance(*victim)
        await self.endpoint.connect(("replacement", victim), address)
        self.endpoint.adopt(victim, ("replacement", victim))
        self.subscribers[victim] = handle
        if seed:
            self.host.seed(seed)
        # Told anew from the bottom: what an Ack's catch-up told it while the connection opened
        # went to its dead predecessor's (a stall: the frontier it was told never moved again).
        self.catching_up[victim] = BOTTOM
        self._on_local_message(ReplaySent(self.incarnations[victim], victim))  # its timers are in: its own hold goes

    async def local_refusal(self) -> Optional[str]:
        """``recovery="local"``: why a failure now cannot be recovered locally (None: it can)."""
        if self.catching_up:
            return "a replacement was still catching up"  # its log is whole only once it has
        if self.host.frontiers is not None:
            return "the instances were still told frontiers of their own"  # a cut must be at or past every frontier told
        if self.host.pushed == TOP:
            return "the run was ending"  # the last watermark is out: a replacement would never be told it
        return None


class LocalStageSide:
    """A :class:`~.actors.StageActor`'s local-recovery methods (its ``host``, ``endpoint``,
    ``drain``, ``lost``, ``plan``, ``key`` and ``kept`` are the actor's)."""

    async def peer_failed(self, victim: tuple, new: Any, cut: tuple, address: Optional[tuple], replay: bool = True) -> dict:
        """``recovery="local"``: instance ``victim`` failed, incarnation ``new`` replaces it
        (listening at ``address`` when this instance sends to it): see
        :meth:`InstanceHost.peer_failed`. The connection opens first; the switch to it, the
        replay and the ReplaySent then run in one go on the event loop. ``replay`` False: a
        replica that is not its instance's primary (it logged what the primary re-sends; it
        connects, for a promotion, and re-sends nothing). Returns the items replayed and
        cancelled."""
        victim = Instance(*victim)
        opened = ("replacement", victim)
        if address is not None:
            await self.endpoint.connect(opened, address)
        part = self.host.recovery
        replayed, cancelled = part.replayed, part.cancelled
        self.drain.drop_from(victim)
        self.host.peer_failed(victim, new, cut, self.batch_size, reconnect=lambda: address is not None and self.endpoint.adopt(victim, opened),
                              replay=replay)
        # The dead one's connection ended: seen, answered; its end seen late (this one may have
        # taken its part first) is no new death (a healthy replacement was recovered again).
        self.lost = LostPeers(self.lost.ignore | {self.plan.actor_name(victim)})
        self.endpoint.on_lost = self.lost.add
        return {"replayed": part.replayed - replayed, "cancelled": part.cancelled - cancelled}

    async def trim_sent(self, t: tuple) -> None:
        """``recovery="local"``: snapshot ``t`` committed; the upstream log keeps what is at or after it."""
        if self.key is not None and self.host.recovery is not None:
            self.host.recovery.trim(t)
            if self.kept is not None:
                self.kept.trim(t)
