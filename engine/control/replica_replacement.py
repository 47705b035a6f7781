"""A replacement replica on Ray (``replicas=r``, ``verify="first"`` or ``"majority"``; issue 58,
design item 4): an instance that lost a replica (a death, or a secondary outvoted) gets a new
one while its live replicas' output goes on; no one else rolls back. The protocol is the
simulator's (:mod:`driftstream.engine.runtime.replica_replacements`), over actor calls
(:mod:`driftstream.engine.runtime.replica_replacement_actors`):

1. a new stage actor (a standby when there is one; else a new process, on a node none of the
   live replicas is on when the cluster has one, started ``START_DELAY_S`` after the death: the
   failover's burst goes first) is readied without holding the supervisor up
   (:meth:`ReplicaReplacement.replace`: a process start takes seconds under load, and a death
   meanwhile must be answered at once); once it is up (:meth:`ReplicaReplacement.poll`, from the
   supervisor's watch) it restores the newest committed snapshot ``T`` (under ``"majority"`` every
   committed snapshot is certified) with the replica sets of that moment, its sinks dropping
   nothing (it keeps what they release, as any replica that is not the primary), its output
   dropped but logged;
2. the acker (:meth:`AckerActor.replica_joining`) sets it aside: its channels stay out of the one
   watermark while it catches up (it is told its own frontier), and holds ``T`` for it until
   each sender's ReplaySent;
3. every stage actor adds it to the instance's fan-out; the senders whose stream the replicas
   take re-send from their logs what they sent the instance at or after ``T``, to it alone;
4. once its frontier met the watermark it joins: a replica as any other (it may become the
   primary; under ``"majority"`` it votes on the epochs that end from then on).

The record's ``kind`` is ``"replica replaced"``, ``restored`` empty (no instance rolled back), its
``snapshot`` the one restored; ``first_output_s``: seconds from the death's detection until it
joined; ``steps_s``: ``start`` (its process up), ``restore``, ``connect``, ``replay``. What cannot
be done (the acker refuses: a failover or recovery under way, the run ending; its actor died)
leaves the instance with one replica fewer and says why (``"replica not replaced (why)"``); a
global rollback meanwhile gives every instance its replicas again (the pending one is dropped).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.ordering.meta import BOTTOM

from driftstream.engine.control.failover import Failover, Recovery
from driftstream.engine.control.launcher import Launcher, setup_answers
from driftstream.engine.control.local_failover import acker_refusal, senders_to
from driftstream.engine.control.replica_launch import Replica
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.model.config import vote_sample
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.actors import StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors
from driftstream.engine.runtime.replicas import address

log = logging.getLogger(__name__)

#: seconds to wait for a failover's re-sends before a replacement is refused
SETTLE_S = 5.0
#: what the acker says while a failover's or recovery's re-sends are not all in (worth waiting for)
UNDER_WAY = "a failover or recovery was still under way"
#: seconds after a death before a new process starts for its replacement: its start (about a
#: second of CPU) must not slow the failover's re-sends and the promoted primary's first output
START_DELAY_S = 0.5


@dataclass
class PendingReplica:
    """A replacement of a replica of ``victim`` whose actor is starting (None: not yet, at
    ``start_at``): ``ready`` answers once its process is up; ``name`` its replica name, ``real``
    its Ray name (a standby's own)."""

    victim: Instance
    actor: Any
    name: str
    real: str
    ready: Any
    detected: float
    start_at: float = 0.0


class ReplicaReplacement:
    """Replaces the lost replicas of ``launcher``'s run (see the module doc); each record goes to
    ``failover.recoveries``. ``pending``: replacements whose actor is starting; ``replaced``:
    replicas replaced so far."""

    def __init__(self, launcher: Launcher, standbys: StandbyPool, failover: Failover) -> None:
        self.launcher, self.standbys, self.failover = launcher, standbys, failover
        self.pending: list = []
        self.replaced = 0

    def replace(self, victim: Instance, detected: float) -> None:
        """Start a replacement of a lost replica of ``victim``: its actor is readied (a standby,
        else a new process away from the live replicas); :meth:`poll` goes on once it is up."""
        run = self.launcher
        name = run.replicas.fresh_name(run.plan.actor_name(victim))
        if len(self.standbys):
            actor, real = self.standbys.take()
            self.pending.append(PendingReplica(victim, actor, name, real, actor.node.remote(), detected))
        else:
            self.pending.append(PendingReplica(victim, None, name, name, None, detected, time.time() + START_DELAY_S))

    def waiting(self) -> list:
        """The refs that answer once a pending replacement's actor is up (for the supervisor's
        wait); first the new processes whose start is due are started."""
        for p in self.pending:
            if p.actor is None and time.time() >= p.start_at:
                p.actor = self._new_actor(p.name, p.victim)
                p.ready = p.actor.node.remote()
        return [p.ready for p in self.pending if p.ready is not None]

    def poll(self, manifest: Optional[Manifest]) -> list:
        """Each pending replacement whose actor is up restores ``manifest`` (None: the beginning)
        and joins (see the module doc). Returns the actors added to the launcher's books. A
        peer's death on the way raises (the supervisor recovers; this replacement is killed)."""
        added = []
        for p in [p for p in self.pending if p.ready is not None and ray.wait([p.ready], timeout=0)[0]]:
            self.pending.remove(p)
            if len(self.launcher.replicas.sets.get(p.victim, ())) >= self.launcher.replicas.counts.get(p.victim, 0):
                kill_actors([p.actor], [p.real])  # a global rollback or a rescale since gave the instance its replicas (or took it)
                continue
            try:
                ray.get(p.ready)
            except ray.exceptions.RayActorError as exc:
                self._not_replaced(p.victim, p.detected, f"its actor died starting ({type(exc).__name__})")
                continue
            if self._join(p, manifest):
                added.append(p.actor)
        return added

    def close(self) -> None:
        """Kill the pending replacements' actors (the run ended, or a rescale relaunches every replica)."""
        started = [p for p in self.pending if p.actor is not None]
        if started:
            kill_actors([p.actor for p in started], [p.real for p in started])
        self.pending = []

    def _join(self, p: PendingReplica, manifest: Optional[Manifest]) -> bool:
        """The replacement ``p``, up, restores ``manifest`` and joins; whether it did."""
        run, plan, victim = self.launcher, self.launcher.plan, p.victim
        up = time.time()
        why = self._settled()
        if why is not None:
            kill_actors([p.actor], [p.real])
            self._not_replaced(victim, p.detected, why)
            return False
        t = BOTTOM if manifest is None else tuple(manifest.t)
        inc = run._next_incarnation
        run._next_incarnation += 1
        sets = run.replicas.sets
        replica_sets = {tuple(k): [r.incarnation for r in rs] + ([inc] if k == victim else []) for k, rs in sets.items()}
        opts = run.rules.instance_config(victim, plan.instances.index(victim), manifest, recovering=True)
        verify = run.rules.config.verify
        sample = vote_sample(verify)
        # as the launcher's (votes under "majority" and "sample:N"); its sinks skip nothing: it writes none, it keeps
        opts = dataclasses.replace(opts, incarnations=dict(run.incarnations), replica_sets=replica_sets, replica=(inc, p.name),
                                   votes=verify == "majority" or sample is not None, sample=sample, skip_released=False)
        actor = p.actor
        try:
            ray.get(actor.reset.remote(opts, run.plane, tuple(victim), plan))
            where = setup_answers([actor.listen.remote()], [p.name])[0]
            restored = time.time()
            senders = senders_to(plan, victim.stage)
            tokens = [address(sets[k][0].incarnation) if k in sets else tuple(k) for k in plan.instances if k.stage in senders]
            why, ends = ray.get(run.acker.replica_joining.remote(tuple(victim), inc, where, tokens, t))
            if why is not None:
                kill_actors([actor], [p.real])
                self._not_replaced(victim, p.detected, why)
                return False
            if ends:  # votes: its digests are cut at the epochs' ends so far
                ray.get(actor.replica_epochs.remote(ends))
            ray.get(actor.connect.remote(run.acker, run.addresses, replicas=run.replicas.wiring()[0]))
            adopting = run.acker.replica_adopt.remote(inc, ray.get(actor.take_seed.remote()))
            connected = time.time()
            streams = {id(run.actors[k]) for k in plan.instances if k.stage in senders}  # primaries, and instances without replicas
            # (the victim's primary is told where too: the draws of its steps declared deterministic=False go to it)
            replayed = sum(ray.get([h.replica_added.remote(tuple(victim), inc, where if self._sends(h, senders) or h is run.actors[victim] else None,
                                                           t, id(h) in streams) for h in run.handles[1:]]))  # handles[0]: the acker
            ray.get(adopting)
            node = ray.get(p.ready)
        except BaseException:
            kill_actors([actor], [p.real])
            raise
        sets[victim].append(Replica(inc, p.name, actor, where=where))
        node_of = dict(run.node_of)
        node_of[p.name] = node
        real_names = dict(run.real_names)
        if p.real != p.name:
            real_names[p.name] = p.real
        # status() reads these on other threads: each replaced whole
        run.node_of, run.real_names, run.handles, run.names = node_of, real_names, run.handles + [actor], run.names + [p.name]
        self.replaced += 1
        log.warning("driftstream: %s replaces a lost replica of %s, restored from %s (%d items re-sent by its senders); "
                    "it joins once caught up", p.name, victim.label, "the beginning" if manifest is None else f"snapshot {manifest.snapshot_id}",
                    replayed)
        recovery = Recovery(p.detected, time.time() - p.detected, None if manifest is None else manifest.snapshot_id,
                            pending=[run.acker.replica_joined.remote(inc)],
                            steps_s={"start": up - p.detected, "restore": restored - up, "connect": connected - restored,
                                     "replay": time.time() - connected},
                            kind="replica replaced", restored=[])
        self.failover.recoveries.append(recovery)
        return True

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

    def _new_actor(self, name: str, victim: Instance) -> Any:
        """A new stage actor with no instance yet (as a standby), named ``name``, on a node none
        of ``victim``'s live replicas is on when the cluster has one."""
        run = self.launcher
        options: dict = {"name": name, "namespace": NAMESPACE}
        taken = {run.node_of.get(r.name) for r in run.replicas.sets[victim]}
        free = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in taken]
        if free:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=free[0], soft=True)
        else:
            log.warning("driftstream: the replacement replica of %s shares a node with a live one: the cluster has no other", victim.label)
        return StageActor.options(**options).remote(run.plan, None, None, None, None)

    def _not_replaced(self, victim: Instance, detected: float, why: str) -> None:
        log.warning("driftstream: the lost replica of %s is not replaced (%s): it runs on with one replica fewer", victim.label, why)
        self.failover.recoveries.append(Recovery(detected, time.time() - detected, kind=f"replica not replaced ({why})", restored=[]))
