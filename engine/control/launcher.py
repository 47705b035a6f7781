"""Launching a plan's actors on Ray: the acker and one stage actor per instance, each
restored from a manifest, connected on the data plane, then started.

A launch after a failure reuses what it can: survivors are reset in place and standbys
take a lost instance's place (a reset costs milliseconds, a new process ~1 s of CPU on
a small machine); only the rest are new actors. The launcher holds the actors of its last
launch and the plan they run: the plan is an argument of each launch, so a later launch
may run another plan (another parallelism) from the same manifest.

>>> launcher = Launcher(RecoveryRules(RunConfig(), snapshot_dir=None), StandbyPool(0))
>>> launcher.plan is None, launcher.names, launcher.actor_names(["wc/acker"])
(True, [], ['wc/acker'])
>>> launcher.launch(flow.plan(parallelism=2), manifest=None, recovering=False)   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Iterable, Iterator, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.snapshots.checksums import CorruptSnapshot

from driftstream.engine.model.config import RunConfig, aligned_sources, vote_sample  # noqa: F401  (RunConfig: the doctest)
from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.recovery import RecoveryRules, replay_limit
from driftstream.engine.control.replica_launch import ReplicaLaunch
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.runtime.actors import AckerActor, StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors
from driftstream.engine.runtime.verifier_actor import VerifierActor
from driftstream.engine.model.config import reexecute_every


class Launcher:
    """Starts a plan's actors (:meth:`launch`) and holds those of the last launch.

    ``names`` are the instances' actor names, the acker's first, in the order of
    ``handles``; ``real_names`` maps one to the name of the actor playing it where that
    differs (a standby, or a new actor whose name Ray still held: ``<name>#<n>``).
    """

    def __init__(self, rules: RecoveryRules, standbys: StandbyPool, warm_acker: Optional[tuple] = None) -> None:
        self.rules = rules
        self.standbys = standbys
        #: a warm acker ``(handle, Ray name)`` the next launch that needs a new acker resets instead
        self.warm_acker = warm_acker
        self.plan: Optional[Plan] = None
        self.acker = None
        self.actors: dict = {}
        self.handles: list = []
        self.names: list = []
        self.real_names: dict = {}
        #: actor name -> the Ray node it runs on
        self.node_of: dict = {}
        #: stage instance reset in the last launch (a survivor, or a standby in a lost one's
        #: place) -> seconds of its ``tear_down``, ``setup`` and ``restore`` (within setup)
        self.resets: dict = {}
        #: wall times of the last launch: begun, reset (actors up), connected, started
        self.marks: list = []
        #: input records skipped by at-most-once restarts (lost on purpose), over every launch
        self.skipped = 0
        #: recovery="local": every instance's incarnation (each launch numbers them anew; None: the default path)
        self.incarnations: Optional[dict] = None
        self._next_incarnation = 0
        #: the data-plane addresses of the last launch ("acker" and each instance)
        self.addresses: dict = {}
        self.plane: Optional[PlaneKey] = None
        #: replicas > 1: the replicas of the replicated instances (RunConfig.replicated; None: the default path)
        self.replicas: Optional[ReplicaLaunch] = None if rules.config.replica_count == 1 else ReplicaLaunch(rules.config)
        #: verify="reexecute:N" with reexecute_on="verifier": the flow's verifier actor, kept over launches (None: none)
        self.verifier = None

    def launch(self, plan: Plan, manifest: Optional[Manifest], recovering: bool, survivors: Optional[dict] = None,
               renamed: Optional[dict] = None, avoid_nodes: Iterable = ()) -> None:
        """Start the acker and every stage actor of ``plan``, restored from ``manifest`` when given.

        ``survivors`` (actor name -> handle) are reset in place instead of replaced; lost
        instances take a standby while there is one. ``renamed``: actor name -> the name its
        new actor takes (the name is still held); ``avoid_nodes``: where no new actor goes.
        """
        survivors, renamed = survivors or {}, renamed or {}
        marks = self.marks = [time.time()]
        placed = placement(set(avoid_nodes))
        # A new secret per launch (old incarnations cannot join); its key pickles to a nonce only:
        # every actor derives the secret from its node's key file (model/data_plane.py).
        plane = PlaneKey.new(self.rules.config.data_plane_tls, self.rules.config.data_plane_key)
        self.plane = plane
        verifier = self._verifier(plan, placed)
        resets: list = []
        reset_names: list = []
        acker_name = acker_name_of(plan)
        warm_acker = None
        local = self.rules.config.recovery == "local"
        # recovery="local": acks keyed by channel, each incarnation numbered anew (a launch restarts every instance)
        extra = {"local": True} if local else {}
        sample = vote_sample(self.rules.config.verify)
        votes = self.replicas is not None and (self.rules.config.verify == "majority" or sample is not None)
        if votes:  # verify="majority" / "sample:N": the acker tallies the replicas' votes
            extra["votes"] = True
        if local:
            self.incarnations = {key: self._next_incarnation + n for n, key in enumerate(plan.instances)}
            self._next_incarnation += len(plan.instances)
        replicas, sets, configs = self.replicas, None, {}
        if replicas is not None:
            if sample is not None:
                extra["sample"] = sample
            sets, self._next_incarnation = replicas.number(plan, self.incarnations, self._next_incarnation)
            replicas.place(sets, plan, first=not survivors and self.plan is None)
        if acker_name in survivors:
            acker = survivors[acker_name]
            resets.append(acker.reset.remote(len(plan.source_instances), plane, **extra))
        elif self.warm_acker is not None:
            (acker, warm_acker), self.warm_acker = self.warm_acker, None
            resets.append(acker.reset.remote(len(plan.source_instances), plane, acker_name, **extra))
        else:
            acker = AckerActor.options(name=renamed.get(acker_name, acker_name), namespace=NAMESPACE,
                                       scheduling_strategy=next(placed)).remote(len(plan.source_instances), plane, **extra)
        # Survivors of another plan (a rescale) and standbys (started with the plan of their
        # day) are handed the plan they now run.
        moved = None if plan is self.plan else plan
        handles, names, actors, real_names = [acker], [acker_name], {}, {}
        if warm_acker is not None:
            real_names[acker_name] = warm_acker
        elif acker_name in renamed:
            real_names[acker_name] = renamed[acker_name]
        elif acker_name in survivors and acker_name in self.real_names:
            real_names[acker_name] = self.real_names[acker_name]
        for ordinal, instance in enumerate(plan.instances):
            opts = self.rules.instance_config(instance, ordinal, manifest, recovering)
            if verifier is not None:
                opts = dataclasses.replace(opts, verifier=verifier)
            if local:
                opts = dataclasses.replace(opts, incarnations=dict(self.incarnations), replica_sets=sets, votes=votes,
                                           sample=sample if votes else None)
                configs[instance] = opts
            name = plan.actor_name(instance)
            if name in survivors:
                actor = survivors[name]
                resets.append(actor.reset.remote(opts, plane, None, moved))
                reset_names.append(name)
                if name in self.real_names:
                    real_names[name] = self.real_names[name]
            elif len(self.standbys):
                actor, real_names[name] = self.standbys.take()
                resets.append(actor.reset.remote(opts, plane, tuple(instance), plan))
                reset_names.append(f"{name} (standby)")
            else:
                real = real_names[name] = renamed.get(name, name)
                strategy = replicas.strategies[instance][0] if sets and instance in sets else None
                actor = StageActor.options(name=real, namespace=NAMESPACE, scheduling_strategy=strategy or next(placed)).remote(plan, *instance, opts, plane)
            actors[instance] = actor
            handles.append(actor)
            names.append(name)
        if sets:  # the replicas that are not the primary: after the instances in names and handles
            resets += replicas.start(plan, configs, sets, actors, survivors, plane)
            reset_names += [r.name for r in replicas.secondaries() if r.name in survivors]
            handles += [r.handle for r in replicas.secondaries()]
            names += [r.name for r in replicas.secondaries()]
        # The coordinator answers status() on other threads while this runs: they must see the
        # old set of actors or the whole new one, never a dict that is being filled.
        self.plan, self.acker, self.actors, self.handles, self.names, self.real_names = plan, acker, actors, handles, names, real_names
        # Stage instances say where their reset went (the acker's, listed first if reset, says nothing).
        # A reset's error stays a task error: one raised tearing the old incarnation down (an
        # OSError) is retried with new actors, whose setup error listen() gives as itself.
        self.resets = {n: t for n, t in zip(reset_names, ray.get(resets)[len(resets) - len(reset_names):])}
        marks.append(time.time())
        keys = list(self.actors)
        extra = [] if not sets else replicas.secondaries()  # replicas > 1: those that are not the primary
        answers = setup_answers([self.actors[k].listen.remote() for k in keys] + [self.acker.listen.remote()] + [r.handle.listen.remote() for r in extra]
                                + [h.node.remote() for h in handles], [plan.actor_name(k) for k in keys] + [acker_name] + [r.name for r in extra] + names)
        addresses = self.addresses = dict(zip(keys + ["acker"], answers[: len(keys) + 1]))
        self.node_of = dict(zip(names, answers[len(keys) + 1 + len(extra):]))
        aligned = aligned_sources(plan, self.rules.config.source_alignment)
        sources = {"source_keys": list(plan.source_instances)} if local else {}
        wired = {}
        if extra:
            at = {r.name: a for r, a in zip(extra, answers[len(keys) + 1:])}
            at.update({plan.actor_name(k): addresses[k] for k in keys})
            stage_side, acker_side = replicas.wiring(at)
            sources["replicas"], wired = acker_side, {"replicas": stage_side}
        stages = list(self.actors.values()) + [r.handle for r in extra]
        # verify="reexecute:N" on the verifier: up before any batch is shipped to it (else the
        # first batches wait for its process, past their bound), and the acker's end told to wait for it
        judged = [] if verifier is None else [verifier.ping.remote(), self.acker.judge_before_end.remote()]
        ray.get([a.connect.remote(self.acker, addresses, **wired) for a in stages]
                + [self.acker.connect.remote(self.actors, addresses, aligned, **sources)] + judged)
        # Restored windows' timers reach the acker before any source starts: the watermark
        # must not pass a close time whose windows have not been emitted.
        seeds = [x for x in ray.get([a.take_seed.remote() for a in stages]) if x]
        if seeds:
            ray.get(self.acker.seed.remote(seeds))
        marks.append(time.time())
        skip_after = None
        if recovering and self.rules.skips_backlog:
            skip_after = replay_limit(ray.get([a.t_last.remote() for a in self.actors.values()]))
        self.skipped += sum(ray.get([a.start.remote(skip_after) for a in self.actors.values()]))
        marks.append(time.time())

    def _verifier(self, plan: Plan, placed: Iterator) -> Optional[object]:
        """The flow's verifier (verify="reexecute:N" on the verifier; None: none): started at the
        first launch, without waiting for it (the instances' first re-runs wait in its queue),
        told a later launch's plan when it changes (a rescale)."""
        c = self.rules.config
        if reexecute_every(c.verify) is None or c.reexecute_on != "verifier":
            return None
        if self.verifier is None:
            self.verifier = VerifierActor.options(namespace=NAMESPACE, scheduling_strategy=next(placed)).remote(plan)
        elif plan is not self.plan:
            self.verifier.use.remote(plan)
        return self.verifier

    def close_verifier(self) -> None:
        """End the flow's verifier (its run ended)."""
        if self.verifier is not None:
            kill_actors([self.verifier], [], wait_s=0)
            self.verifier = None

    def actor_names(self, names: Iterable[str]) -> list:
        """The names of the actors playing the instances ``names`` (a standby keeps its own)."""
        return [self.real_names.get(n, n) for n in names]

    def kept_by(self, plan: Plan) -> dict:
        """The actors of the last launch that a launch of ``plan`` (a rescale's) resets in place,
        actor name -> handle: the acker, the instances both plans have and, with replicas, as many
        of their replicas as ``plan`` gives them; the others are the caller's to kill.

        >>> Launcher(RecoveryRules(RunConfig(), snapshot_dir=None), StandbyPool(0)).kept_by(flow.plan(3))  # doctest: +SKIP
        {'wc/acker': Actor(...), 'wc/count/0': Actor(...), 'wc/count/1': Actor(...)}
        """
        wanted = {plan.actor_name(i) for i in plan.instances} | set(self.names[:1])  # names[0]: the acker
        if self.replicas is not None:
            wanted |= self.replicas.kept_by(plan)
        return {name: h for name, h in zip(self.names, self.handles) if name in wanted}

    def handles_of(self, names: Iterable[str]) -> list:
        """The handles of the actors of ``names`` (instance names) that the last launch started."""
        wanted = set(names)
        return [h for n, h in zip(self.names, self.handles) if n in wanted]

    def sinks(self) -> list:
        """The stage actors whose stage ends in a sink."""
        plan = self.plan
        return [a for k, a in self.actors.items() if any(plan.steps[sid].kind.is_sink for sid in plan.stages[k.stage].step_ids)]

    def reports(self) -> list:
        """Every stage actor's report of the run so far."""
        return ray.get([a.report.remote() for a in self.actors.values()])


def setup_answers(refs: list, names: list) -> list:
    """``ray.get(refs)`` of the calls that start a launch's actors (``listen``, the first call
    a new actor answers, raises what its setup raised), made to the instances ``names``: an
    instance's own error comes out as itself, its name and traceback in a note, so that the
    run ends with it at once, not after retries that fail alike. A damaged snapshot file stays
    a task error (the supervisor falls back to an older snapshot), a death a RayActorError (a
    recovery)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, Exception) or isinstance(cause, CorruptSnapshot):
            raise
        failed = [name for ref, name in zip(refs, names) if _raises(ref)]
        where = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray's text: the traceback in the actor, uncoloured
        cause.add_note(f"raised as {failed[0] if failed else 'an instance'} was set up (its actor's traceback: {where})")
        raise cause from None


def _raises(ref: object) -> bool:
    """Whether the answered call ``ref`` failed with an error of its own (not a death)."""
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError:
        return True
    except ray.exceptions.RayError:
        pass
    return False


def first_release_of(refs: list) -> Optional[float]:
    """The earliest wall time among the answered ``first_release()`` calls ``refs`` (sinks of
    a launch), None while none has answered. O(refs), never waits."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    times = []
    for ref in ready:
        try:
            times.append(ray.get(ref))
        except ray.exceptions.RayActorError:
            pass
    return min(times) if times else None


def acker_name_of(plan: Plan) -> str:
    """The acker's actor name (the first of :attr:`Launcher.names`)."""
    return f"{plan.flow_name}/acker"


def placement(avoid_nodes: set) -> Iterator:
    """Scheduling strategies for new actors, one per call of ``next``: away from
    ``avoid_nodes`` (those that lost actors in this recovery), round-robin over the others;
    Ray's SPREAD when no node is to be avoided or none is left. A node that vanished stays
    alive in Ray's view until its health check fails (~14 s): without this, replacements
    could be placed there and die with it again."""
    others = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in avoid_nodes] if avoid_nodes else []
    if not others:
        while True:
            yield "SPREAD"
    while True:
        for node in others:
            # Hard: with soft, Ray may still spill an actor back to the lost node it takes for alive.
            yield NodeAffinitySchedulingStrategy(node_id=node, soft=False)
