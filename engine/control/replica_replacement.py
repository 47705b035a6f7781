"""A replacement replica on Ray (``replicas=r``, ``verify="first"`` or ``"majority"``; issue 58,
design item 4): an instance that lost a replica (a death, or a secondary outvoted) gets a new
one while its live replicas' output goes on; no one else rolls back. The protocol is the
simulator's (:mod:`driftstream.engine.runtime.replica_replacements`), over actor calls
(:mod:`driftstream.engine.runtime.replica_replacement_actors`):

1. a new stage actor (a standby when there is one; else new, on a node none of the live
   replicas is on when the cluster has one) restores the newest committed snapshot ``T`` (under
   ``"majority"`` every committed snapshot is certified), its sinks dropping nothing (it keeps
   what they release, as any replica that is not the primary), its output dropped but logged;
2. the acker (:meth:`AckerActor.replica_joining`) sets it aside: its channels stay out of the one
   watermark while it catches up (it is told its own frontier), and holds ``T`` for it until
   each sender's ReplaySent;
3. every stage actor adds it to the instance's fan-out; the senders whose stream the replicas
   take re-send from their logs what they sent the instance at or after ``T``, to it alone;
4. once its frontier met the watermark it joins: a replica as any other (it may become the
   primary; under ``"majority"`` it votes on the epochs that end from then on).

The record's ``kind`` is ``"replica replaced"``, ``restored`` empty (no instance rolled back), its
``snapshot`` the one restored; ``first_output_s``: seconds from the death's detection until it
joined. What cannot be done (the acker refuses: a failover or recovery under way, the run ending)
leaves the instance with one replica fewer and says why (``"replica not replaced (why)"``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.ordering.meta import BOTTOM

from driftstream.engine.control.failover import Failover, Recovery
from driftstream.engine.control.launcher import Launcher, setup_answers
from driftstream.engine.control.local_failover import acker_refusal, senders_to
from driftstream.engine.control.replica_launch import Replica
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.actors import StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE
from driftstream.engine.runtime.replicas import address

log = logging.getLogger(__name__)

#: seconds to wait for a failover's re-sends before a replacement is refused
SETTLE_S = 5.0
#: what the acker says while a failover's or recovery's re-sends are not all in (worth waiting for)
UNDER_WAY = "a failover or recovery was still under way"


class ReplicaReplacement:
    """Replaces the lost replicas of ``launcher``'s run (see the module doc); each record goes to
    ``failover.recoveries``. ``replaced``: replicas replaced so far."""

    def __init__(self, launcher: Launcher, standbys: StandbyPool, failover: Failover) -> None:
        self.launcher, self.standbys, self.failover = launcher, standbys, failover
        self.replaced = 0

    def replace(self, victim: Instance, detected: float, manifest: Optional[Manifest]) -> Recovery:
        """A new replica of ``victim`` from ``manifest`` (None: the beginning). Returns its record."""
        run, plan = self.launcher, self.launcher.plan
        entered = time.time()
        why = self._settled()
        if why is not None:
            return self._not_replaced(victim, detected, why)
        t = BOTTOM if manifest is None else tuple(manifest.t)
        inc = run._next_incarnation
        run._next_incarnation += 1
        sets = run.replicas.sets
        name = run.replicas.fresh_name(plan.actor_name(victim))
        replica_sets = {tuple(k): [r.incarnation for r in rs] + ([inc] if k == victim else []) for k, rs in sets.items()}
        opts = run.rules.instance_config(victim, plan.instances.index(victim), manifest, recovering=True)
        opts = dataclasses.replace(opts, incarnations=dict(run.incarnations), replica_sets=replica_sets, replica=(inc, name),
                                   votes=run.rules.config.verify == "majority", skip_released=False)  # it writes no sink: it keeps
        actor, real = self._start(name, victim, opts)
        try:
            where, node = setup_answers([actor.listen.remote(), actor.node.remote()], [name, name])
            started = time.time()
            senders = senders_to(plan, victim.stage)
            tokens = [address(sets[k][0].incarnation) if k in sets else tuple(k) for k in plan.instances if k.stage in senders]
            why, ends = ray.get(run.acker.replica_joining.remote(tuple(victim), inc, where, tokens, t))
            if why is not None:
                ray.kill(actor, no_restart=True)
                return self._not_replaced(victim, detected, why)
            if ends:  # verify="majority": its digests are cut at the epochs' ends so far
                ray.get(actor.replica_epochs.remote(ends))
            ray.get(actor.connect.remote(run.acker, run.addresses, replicas=run.replicas.wiring()[0]))
            adopting = run.acker.replica_adopt.remote(inc, ray.get(actor.take_seed.remote()))
            connected = time.time()
            streams = {id(run.actors[k]) for k in plan.instances if k.stage in senders}  # primaries, and instances without replicas
            peers = run.handles[1:]  # handles[0]: the acker
            replayed = sum(ray.get([h.replica_added.remote(tuple(victim), inc, where if self._sends(h, senders) else None, t,
                                                           id(h) in streams) for h in peers]))
            ray.get(adopting)
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        sets[victim].append(Replica(inc, name, actor, where=where))
        node_of = dict(run.node_of)
        node_of[name] = node
        real_names = dict(run.real_names)
        if real != name:
            real_names[name] = real
        # status() reads these on other threads: each replaced whole
        run.node_of, run.real_names, run.handles, run.names = node_of, real_names, run.handles + [actor], run.names + [name]
        self.replaced += 1
        log.warning("driftstream: %s replaces a lost replica of %s, restored from %s (%d items re-sent by its senders); "
                    "it joins once caught up", name, victim.label, "the beginning" if manifest is None else f"snapshot {manifest.snapshot_id}",
                    replayed)
        recovery = Recovery(detected, time.time() - detected, None if manifest is None else manifest.snapshot_id,
                            pending=[run.acker.replica_joined.remote(inc)],
                            steps_s={"settle": started - entered, "connect": connected - started, "replay": time.time() - connected},
                            kind="replica replaced", restored=[])
        self.failover.recoveries.append(recovery)
        return recovery

    def _sends(self, handle: Any, senders: set) -> bool:
        """Whether the actor ``handle`` plays (or replicates) an instance of a stage in ``senders``."""
        run = self.launcher
        for k, actor in run.actors.items():
            if actor is handle:
                return k.stage in senders
        found = run.replicas.holding(handle)
        return found is not None and found[0].stage in senders

    def _settled(self) -> Optional[str]:
        """Wait until a failover's re-sends are in (the acker holds nothing); why a replacement
        cannot start now, or None."""
        deadline = time.time() + SETTLE_S
        while True:
            why = acker_refusal(self.launcher.acker.replica_refusal.remote())
            if why != UNDER_WAY or time.time() > deadline:
                return why
            time.sleep(0.01)

    def _start(self, name: str, victim: Instance, opts: Any) -> tuple:
        """The replacement's actor and its Ray name: a standby reset, or a new actor named
        ``name``, away from the live replicas' nodes when the cluster has another."""
        run = self.launcher
        if len(self.standbys):
            actor, real = self.standbys.take()
            ray.get(actor.reset.remote(opts, run.plane, tuple(victim), run.plan))
            return actor, real
        options: dict = {"name": name, "namespace": NAMESPACE}
        taken = {run.node_of.get(r.name) for r in run.replicas.sets[victim]}
        free = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in taken]
        if free:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=free[0], soft=True)
        else:
            log.warning("driftstream: the replacement replica of %s shares a node with a live one: the cluster has no other", victim.label)
        return StageActor.options(**options).remote(run.plan, *victim, opts, run.plane), name

    def _not_replaced(self, victim: Instance, detected: float, why: str) -> Recovery:
        log.warning("driftstream: the lost replica of %s is not replaced (%s): it runs on with one replica fewer", victim.label, why)
        recovery = Recovery(detected, time.time() - detected, kind=f"replica not replaced ({why})", restored=[])
        self.failover.recoveries.append(recovery)
        return recovery
