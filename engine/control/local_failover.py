"""Local recovery on Ray (``recovery="local"``, issue 58): one stage instance died, only it is
replaced, and the others never roll back. The protocol is the simulator's
(:mod:`driftstream.engine.runtime.local_recovery`), over actor calls:

1. the acker (:meth:`AckerActor.local_fail`) gives up the snapshot being collected, discards
   the dead incarnation's tables (and its source's bound), holds the restored snapshot's T
   for every survivor and the replacement, returns the cut ``W`` (its watermark), and tells each instance its own
   frontier from then on (the others release on while the replacement catches up) until every
   instance is back under one watermark;
2. the replacement (a standby if there is one, else a new actor) restores the newest
   committed snapshot with its new incarnation (beside step 1), connects with the cut, and the
   acker adopts it (its restored timers seeded, then its own hold at T released; told the raw
   frontier until it catches up);
3. meanwhile every survivor (:meth:`StageActor.peer_failed`) drops the dead one's queued batches,
   processes what its input merge held, cancels what the dead one sent at or above ``W``,
   re-sends its log to the replacement and sends the acker its ``ReplaySent``; its receivers
   first when it has senders too, so that nothing it sends meets a receiver before (:func:`part_rounds`);
4. the replacement starts reading (a source instance, from T).

What it cannot do falls back to the global rollback and says so in the recovery's ``kind``
(:meth:`LocalFailover.refusal`: the acker died, more than one actor, a rescale under way; the
acker's, with its ``local_fail`` in one call, raised as :class:`LocalRefused`: a replacement
still catching up, the run's last watermark already out).

>>> LocalFailover.refusal_of({"f/acker"}, "f/acker", rescaling=False)
'the acker died'
>>> LocalFailover.refusal_of({"f/a/0"}, "f/acker", rescaling=False) is None
True
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import ray

from driftstream.ordering.meta import BOTTOM

from driftstream.engine.control.failover import STANDBY_REPLENISH_DELAY_S, Failover, Recovery
from driftstream.engine.control.launcher import Launcher, setup_answers
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.actors import StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE
from driftstream.engine.runtime.replicas import address as replica_address


def acker_refusal(ref: ray.ObjectRef) -> Optional[str]:
    """The acker's answer ``ref`` to why a failure cannot be recovered locally now (None: it can)."""
    try:
        return ray.get(ref, timeout=5)
    except (ray.exceptions.RayError, TimeoutError):
        return "the acker did not answer"


class LocalRefused(Exception):
    """The acker found that the failure cannot be recovered locally now (``why``); nothing changed."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def senders_to(plan: Plan, stage: int) -> set:
    """The stages with a channel to ``stage``."""
    return {s.index for s in plan.stages if stage in plan.receivers_of(s.index)}


def part_rounds(plan: Plan, victim: Instance, peers: list) -> list:
    """``peers`` (``(instance, handle, ...)`` of the survivors and their replicas) in the rounds their
    :meth:`StageActor.peer_failed` calls take, each awaited before the next.

    The replacement's receivers take their part before its senders: its output reaching one
    before would be dropped as the dead one's batches in flight, or cancelled with them (its
    sender is the same instance), and it has no input before its senders' part. Without a
    receiver or without a sender, one round (a round trip to busy instances less)."""
    senders = senders_to(plan, victim.stage)
    receivers = plan.receivers_of(victim.stage)
    if not (any(k.stage in receivers for k, *_ in peers) and any(k.stage in senders for k, *_ in peers)):
        return [peers]
    return [[p for p in peers if p[0].stage not in senders], [p for p in peers if p[0].stage in senders]]


class LocalFailover:
    """Replaces one dead stage instance of ``launcher``'s run in place of a global rollback
    (see the module doc); each recovery's record goes to ``failover.recoveries``."""

    def __init__(self, launcher: Launcher, standbys: StandbyPool, failover: Failover) -> None:
        self.launcher, self.standbys, self.failover = launcher, standbys, failover
        #: items re-sent from logs and undone at receivers, over the run's local recoveries
        self.replayed = self.cancelled = 0

    @staticmethod
    def refusal_of(dead: Optional[set], acker: str, rescaling: bool) -> Optional[str]:
        """Why a failure of ``dead`` (actor names; None: every one) cannot be recovered locally,
        as far as the supervisor knows, or None."""
        if not dead:
            return "every actor is restarted"
        if acker in dead:
            return "the acker died"
        if len(dead) > 1:
            return f"{len(dead)} actors died at once"
        if rescaling:
            return "a rescale is under way"
        return None

    def refusal(self, dead: Optional[set], rescaling: bool) -> Optional[str]:
        """:meth:`refusal_of` for this run. The acker's reasons (a replacement still catching up,
        the run ending; replicas > 1: a failover's re-sends not all in) come with its
        ``local_fail``, in :meth:`recover`: asked apart, they were a round trip to a busy acker
        before the recovery began, and could change before it did."""
        return self.refusal_of(dead, self.launcher.names[0], rescaling)

    def recover(self, name: str, detected: float, manifest: Optional[Manifest]) -> Recovery:
        """Replace instance ``name`` (its actor died) from ``manifest`` (None: the beginning);
        the others go on. Returns the recovery's record; LocalRefused when the acker refuses
        (the replacement killed, nothing else changed but the dead one's kill)."""
        run, plan = self.launcher, self.launcher.plan
        entered = time.time()
        victim = plan.instances[run.names.index(name) - 1]  # names: the acker's, then the instances' in order
        t = BOTTOM if manifest is None else tuple(manifest.t)
        old, new = run.incarnations[victim], run._next_incarnation
        run._next_incarnation += 1
        run.incarnations[victim] = new
        survivors = [k for k in plan.instances if k != victim]
        standby = len(self.standbys) > 0
        self.failover.kill(run.handles_of([name]), [] if standby else [name])
        killed = time.time()
        replicas = {} if run.replicas is None else run.replicas.sets  # replicas > 1: the victim has none (replicas never restore)
        # Whose ReplaySent the acker holds for: a replica's names its incarnation
        tokens = [replica_address(r.incarnation) for k in survivors for r in replicas.get(k, ())]
        tokens += [tuple(k) for k in survivors if k not in replicas]
        # The acker takes the failure in (or refuses it) while the replacement restores: its cut
        # reaches the replacement with connect(), before any input or output.
        failed = run.acker.local_fail.remote(tuple(victim), old, new, tokens, t, dict(run.incarnations), plan.cones(), plan.actor_name(victim),
                                             replicas=run.replicas is not None)
        opts = run.rules.instance_config(victim, plan.instances.index(victim), manifest, recovering=True)
        opts = dataclasses.replace(opts, incarnations=dict(run.incarnations),
                                   replica_sets={k: [r.incarnation for r in rs] for k, rs in replicas.items()} if replicas else None)
        real_names = dict(run.real_names)
        actor, resetting = self._start(name, victim, opts, standby, real_names)
        try:  # until the launcher holds it, a global rollback after an error here would not end it
            resets = {f"{name} (standby)": ray.get(resetting)} if resetting is not None else {}
            # Sent together once it is set up (an async actor may run one caller's calls out of order)
            calls = [actor.listen.remote(), actor.node.remote()]
            seed = actor.take_seed.remote()
            cut, why = ray.get(failed)
            if why is not None:
                raise LocalRefused(why)
            connecting = actor.connect.remote(run.acker, run.addresses, cut=cut, **({"replicas": run.replicas.wiring()[0]} if replicas else {}))
            address, node = setup_answers(calls, [name, name])
            reset = time.time()
            addresses = dict(run.addresses)
            addresses[victim] = address
            ray.get(connecting)
            # The acker holds T for the replacement until it has its timers: the survivors' parts go meanwhile
            adopting = run.acker.adopt.remote(tuple(victim), actor, address, seed)
            connected = time.time()
            parts = self._take_parts(victim, survivors, replicas, new, cut, address)
            ray.get(adopting)
            if victim in plan.source_instances:  # an instance without a source has nothing to start
                ray.get(actor.start.remote(None))
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        started = time.time()
        self.replayed += sum(p["replayed"] for p in parts)
        self.cancelled += sum(p["cancelled"] for p in parts)
        actors = dict(run.actors)
        actors[victim] = actor
        node_of = dict(run.node_of)
        node_of[name] = node
        # status() reads these on other threads: each replaced whole
        run.actors, run.real_names, run.node_of, run.addresses = actors, real_names, node_of, addresses
        run.handles = [actor if n == name else h for n, h in zip(run.names, run.handles)]
        run.resets = resets
        sink = any(plan.steps[sid].kind.is_sink for sid in plan.stages[victim.stage].step_ids)
        recovery = Recovery(detected, time.time() - detected, None if manifest is None else manifest.snapshot_id,
                            pending=[a.first_release.remote() for a in ([actor] if sink else run.sinks())],
                            steps_s={"confirm": entered - detected, "kill": killed - entered, "reset": reset - killed,
                                     "connect": connected - reset, "replay": started - connected},
                            resets_s=resets, kind="local", restored=[victim.label])
        self.failover.recoveries.append(recovery)
        # A new standby's process start (about a second of CPU) would slow the replacement's catch-up
        self.standbys.delay(STANDBY_REPLENISH_DELAY_S)
        return recovery

    def _take_parts(self, victim: Instance, survivors: list, replicas: dict, new: int, cut: tuple, address: tuple) -> list:
        """Every survivor's (and its replicas') :meth:`StageActor.peer_failed`, in the rounds
        of :func:`part_rounds`; their answers. Only an instance's primary re-sends its log: its
        other replicas logged the same items, and the replacement would take each twice."""
        plan = self.launcher.plan
        senders = senders_to(plan, victim.stage)
        peers = [(k, self.launcher.actors[k], True) for k in survivors] + [(k, r.handle, False) for k in survivors for r in replicas.get(k, ())[1:]]
        return [part for peers in part_rounds(plan, victim, peers)
                for part in ray.get([h.peer_failed.remote(tuple(victim), new, cut, address if k.stage in senders else None, primary)
                                     for k, h, primary in peers])]

    def _start(self, name: str, victim: Instance, opts: InstanceConfig, standby: bool, real_names: dict) -> tuple:
        """The replacement of instance ``name``, ``(actor, ref of a standby's reset() or None)``:
        a standby reset, or a new actor (under the name the kill left free); ``real_names``
        learns its actor's name."""
        run = self.launcher
        if standby:
            actor, real_names[name] = self.standbys.take()
            return actor, actor.reset.remote(opts, run.plane, tuple(victim), run.plan)
        real = real_names[name] = self.failover.take_renames().get(name, name)
        return StageActor.options(name=real, namespace=NAMESPACE).remote(run.plan, *victim, opts, run.plane), None
