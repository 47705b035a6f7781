"""The driver side of a run on Ray: the loop that watches a run's actors, wiring the parts
that do the work.

- :class:`~.launcher.Launcher` starts a plan's actors (restored from a manifest) and
  holds those of the last launch;
- :class:`~.snapshot_committer.SnapshotCommitter` takes snapshots through the acker and
  commits their manifests, retrying after a store failure;
- :class:`~.failover.Failover` finds the lost actors and restarts the run from the
  newest manifest, keeping each recovery's record; :class:`~.standbys.StandbyPool`
  holds the processes ready to take a lost instance's place;
- :class:`~.live_status.LiveStatus` reads the figures ``status()`` shows;
- :func:`~.resume.start_point` decides where the run starts (the snapshot, checked
  against the flow, and the parallelism); :class:`~.rescaler.Rescaler` moves the run to
  another parallelism, and takes the drained snapshot a stop ends with.

The watch loop (:meth:`RaySupervisor.run`) waits on the acker's end of the run and on a
never-returning ``alive()`` call on every actor, commits snapshots as they arrive, and
hands a death, a hung actor or a stop to the part that deals with it.

>>> supervisor = RaySupervisor(flow.plan(parallelism=2), RunConfig(guarantee="exactly-once"))  # doctest: +SKIP
>>> result = supervisor.run(timeout=60)                                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Callable, Optional

import ray

from driftstream.engine.model.config import RunConfig, vote_sample
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.recovery import RecoveryRules
from driftstream.engine.model.result import RunResult, merge_instances
from driftstream.engine.control.corrupt_snapshots import CorruptSnapshots, corrupt_cause
from driftstream.engine.control.failover import Failover, Heartbeat, Hung
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.live_status import LiveStatus, SupervisorStatus
from driftstream.engine.control.local_failover import LocalFailover, LocalRefused
from driftstream.engine.control.replica_dissents import ReplicaDissents
from driftstream.engine.control.replica_failover import ReplicaFailover
from driftstream.engine.control.replica_replacement import ReplicaReplacement
from driftstream.engine.control.rescaler import Rescaler
from driftstream.engine.control.resume import check_sinks, start_point
from driftstream.engine.control.snapshot_committer import SnapshotCommitter
from driftstream.engine.control.snapshot_log import SnapshotRecord
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.control.warm_set import WARM_PREFIX, WarmActors, retire
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors
from driftstream.engine.runtime.replica_votes import VoteRollback
from driftstream.engine.runtime.stage_snapshots import remove_dead_workdirs


class RaySupervisor:
    """Runs one plan on Ray with a delivery guarantee. ``run()`` returns when bounded sources are done."""

    def __init__(self, plan: Plan, config: RunConfig, warm: Optional[WarmActors] = None) -> None:
        self.plan = plan
        #: the stage participants of every plan the run has had (a rescale's kills leave theirs)
        self.participants = {plan.stage_participant(s.index) for s in plan.stages}
        self.config = config
        # Test-only fault injection: {"before_commit" | "after_restore" | "rescale_restore": [actor name, ...]}; each
        # entry is a real ray.kill of that actor at that moment of the protocol, used once.
        self.faults: dict = {k: list(v) for k, v in config.faults.items()}
        self.stop_requested = threading.Event()
        self.committer = SnapshotCommitter(plan, config, before_commit=functools.partial(self._inject, "before_commit"))
        self.snapshot_dir: Optional[str] = self.committer.snapshot_dir
        self.standbys = StandbyPool(config.standby_count)
        # Warm stage actors are standbys the first launch takes in order; a warm acker, its acker.
        warm = warm or WarmActors()
        self.standbys.adopt(warm.stages)
        self.launcher = Launcher(RecoveryRules(config, self.snapshot_dir), self.standbys, warm_acker=warm.take_acker())
        self.failover = Failover(self.launcher, self.standbys)
        #: recovery="local": one dead stage instance is replaced alone (None: every failure rolls back globally)
        self.local: Optional[LocalFailover] = None
        if config.recovery == "local":
            self.local = LocalFailover(self.launcher, self.standbys, self.failover)
            self.committer.after_commit = self._trim_sent
        #: replicas > 1: a replica's death fails over to a live one (None: the default path)
        self.replicas: Optional[ReplicaFailover] = None if config.replica_count == 1 else ReplicaFailover(self.launcher, self.failover)
        #: a death the replicas take over is answered at once (Failover.confirm; None: after its quiet wait)
        self._at_once = None if self.replicas is None else self.replicas.fails_over
        #: replicas > 1: an instance that lost a replica gets a new one, restored and caught up
        self.replacement = None if self.replicas is None else ReplicaReplacement(self.launcher, self.standbys, self.failover)
        #: verify="majority" / "sample:N": the replicas' dissents, and a vote's rollback (None: the default path)
        voting = self.replicas is not None and (config.verify == "majority" or vote_sample(config.verify) is not None)
        self.dissents = ReplicaDissents(self.launcher, self.committer.store) if voting else None
        self.live = LiveStatus(self.launcher, self.committer, self.failover)
        self.corrupt = CorruptSnapshots(self.committer)
        self.rescaler = Rescaler(self.launcher, self.committer, self._relaunch, functools.partial(self._inject, "rescale_restore"))

    @property
    def status(self) -> SupervisorStatus:
        """The run's snapshots, recoveries and skipped records so far."""
        return self.live.history()

    def run(self, timeout: Optional[float] = None, on_launched: Optional[Callable[[], None]] = None) -> RunResult:
        """Launch, watch until the run ends (recovering from failures), return its result.
        ``on_launched`` is called once the actors are up; past ``timeout`` s, TimeoutError."""
        committer = self.committer
        start = start_point(self.plan, self.config, self.launcher.rules, committer.store, committer.take_id() if self.config.resume else 0)
        committer.past_existing()
        if start.rescale_to is not None:
            self.rescaler.catch_up_then(self.plan, start.rescale_to)
        self._switch_plan(start.plan)
        check_sinks(self.plan)
        manifest = start.manifest
        t0 = time.time()
        # A resumed run's sinks may hold output past the manifest (or output without any manifest).
        self._launch_surviving(manifest, recovering=self.config.resume)
        self.live.started_from = committer.restored  # the run's counts are those since (see LiveStatus.carried)
        self.standbys.replenish(self.plan)
        if on_launched is not None:
            on_launched()
        deadline = None if timeout is None else t0 + timeout
        while True:
            outcome, detail = self._watch(deadline)
            if outcome == "rescale":
                try:
                    self.rescaler.run(self.plan)
                    continue
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(exc.cause, OSError):
                        raise
                    # An actor died while the rescale drained or restarted: recover, then try again.
                    outcome, detail = "died", (None, time.time())
            if outcome != "died":
                break
            if not self.committer.takes_snapshots:
                kill_actors(self.launcher.handles, self.launcher.names)
                raise RuntimeError("an actor of the run died and guarantee='none' takes no snapshots to recover from")
            self.recover(*detail)
        self.rescaler.end(error=RuntimeError(f"the run ended ({outcome}) before the rescale"))
        wall = time.time() - t0
        if outcome == "error":
            raise detail
        self.failover.resolve()
        reports = detail if outcome == "done" else self.launcher.reports()
        result = merge_instances(reports, wall, [s.name for s in self.plan.steps if s.kind.is_sink])
        status, m = self.status, result.metrics
        m.carry(self.live.carried())
        m.snapshots, m.snapshot_failures = status.committed, status.snapshot_failures
        m.recoveries, m.skipped = len(status.recoveries), status.skipped
        m.recovery_s = [r.to_dict() for r in status.recoveries]
        m.restores = restores_of(status.recoveries, self.plan)
        m.failovers = sum(r.kind == "failover" for r in status.recoveries)
        m.replacements = sum(r.kind == "replica replaced" for r in status.recoveries)
        if self.dissents is not None:
            m.dissents = self.dissents.gather()
        m.snapshot_s = [r.duration_s for r in status.snapshots]
        m.snapshot_windows = [(r.requested_at, r.requested_at + r.duration_s) for r in status.snapshots]
        return result

    def _watch(self, deadline: Optional[float]) -> tuple:
        """Take snapshots on schedule until the run ends, fails, is stopped or loses an actor.

        Returns ``("done", reports)``, ``("stopped", None)``, ``("error", exception)`` or
        ``("died", (names of dead actors, wall time the death was seen))``.
        """
        run, committer = self.launcher, self.committer
        done_ref = run.acker.wait.remote()
        alive = [h.alive.remote() for h in run.handles]
        heartbeat = Heartbeat(self.config.heartbeat_timeout)
        committer.schedule()
        try:
            while True:
                replacing = [] if self.replacement is None else self.replacement.waiting()  # (starts those due)
                ready, _ = ray.wait([done_ref] + alive + replacing, num_returns=1, timeout=committer.wait())
                try:
                    if replacing:  # replicas > 1: a replacement replica's actor is up: it restores and joins
                        ready = [r for r in ready if r not in replacing]
                        alive += [h.alive.remote() for h in self.replacement.poll(committer.latest_manifest())]
                    hung = heartbeat.hung(run.names, run.handles)
                    if hung and committer.takes_snapshots:
                        raise Hung(hung)
                    if done_ref in ready:
                        error = ray.get(done_ref)
                        if error is None:
                            return "done", run.reports()
                        if isinstance(error, ray.exceptions.RayActorError) and committer.takes_snapshots:
                            return "died", self.failover.confirm(alive, self._at_once)  # a stage died while releasing the end
                        if isinstance(error, VoteRollback) and self.dissents is not None:
                            refused = self.dissents.rolled_back(error)  # every instance restarts (none dead) from a certified snapshot
                            return ("died", (set(), time.time())) if refused is None else ("error", refused)
                        return "error", error
                    committer.commit_arrived(run.acker)
                    if ready:
                        return "died", self.failover.confirm(alive, self._at_once)
                    if self.stop_requested.is_set():
                        self.rescaler.final_snapshot()
                        return "stopped", None
                    if self.rescaler.due():
                        committer.finish_schedule(run.acker)
                        return "rescale", None
                    if deadline is not None and time.time() > deadline:
                        return "error", TimeoutError("run did not finish in time")
                    committer.start_when_due(run.acker)
                    if self.standbys.due():
                        self.standbys.replenish(self.plan)
                except ray.exceptions.RayActorError:
                    return "died", self.failover.confirm(alive, self._at_once)
                except Hung as exc:
                    kill_actors(run.handles_of(exc.names), sorted(exc.names))
                    return "died", (exc.names, time.time())
        finally:
            committer.abandon()

    def _launch_surviving(
        self, manifest: Optional[Manifest], recovering: bool, attempts: int = 5, survivors: Optional[dict] = None
    ) -> Optional[Manifest]:
        """Launch; if an actor dies while the run starts, start again (from the newest manifest),
        this time with every actor new."""
        run, failover = self.launcher, self.failover
        attempt = 0
        while True:
            try:
                run.launch(self.plan, manifest, recovering, survivors if attempt == 0 else None,
                           renamed=failover.take_renames(), avoid_nodes=failover.avoid_nodes)
                self.committer.restored = manifest
                return manifest
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                corrupt = corrupt_cause(exc)
                if corrupt is not None and manifest is not None:  # a stored file is damaged: the snapshot before
                    failover.kill(run.handles, run.names)
                    manifest, recovering, survivors = self.corrupt.fall_back(manifest, corrupt), True, None
                    continue  # not an attempt: each fallback sets a snapshot aside, so this ends
                # An actor died while the run starts: its call failed, or a peer's connection to it did.
                if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(exc.cause, OSError):
                    raise
                attempt += 1
                if not self.committer.takes_snapshots or attempt == attempts:
                    raise
                failover.kill(run.handles, run.names)
                manifest, recovering = self.committer.latest_manifest(), True
                failover.count_restart(manifest)

    def _relaunch(self, plan: Plan, manifest: Manifest, survivors: dict) -> None:
        """Launch ``plan`` (a rescale's) from ``manifest``, resetting ``survivors`` (replicas too) in place."""
        if self.dissents is not None:
            self.dissents.gather(timeout=1.0)  # the reset acker forgets its dissents
        if self.replacement is not None:
            self.replacement.close()  # the launch gives every instance its replicas (and may have no instance it was for)
        self._switch_plan(plan)
        self._launch_surviving(manifest, recovering=True, survivors=survivors)

    def _switch_plan(self, plan: Plan) -> None:
        self.plan = self.committer.plan = plan
        self.participants.update(plan.stage_participant(s.index) for s in plan.stages)

    def recover(self, dead: Optional[set] = None, detected: Optional[float] = None) -> None:
        """Restart the run from the newest manifest: replace the ``dead`` actors, reset the
        others. Under recovery="local", one dead stage instance is replaced alone; what that
        cannot handle rolls back globally and says why in the record's ``kind``."""
        why = None
        if self.dissents is not None:
            self.dissents.gather(timeout=1.0)  # a global rollback resets the acker, and its dissents with it
        if self.replicas is not None:
            why, dead = self._fail_over(dead, detected)
            if why is None:
                return
        if self.local is not None and (self.replicas is None or self.replicas.unreplicated(dead)):
            why = self.local.refusal(dead, self.rescaler.due())
            if why is None:
                try:
                    self.local.recover(next(iter(dead)), detected or time.time(), self.committer.latest_manifest())
                    self._inject("after_restore")
                    return
                except LocalRefused as exc:
                    why = exc.why
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                    why, dead = f"an actor died during the local recovery ({type(exc).__name__})", None
        if self.dissents is not None:  # sample:N: restore a certified snapshot, not a newer one (a vote's rollback set them aside already)
            self.dissents.set_aside_uncertified(f"a global rollback ({why or 'an actor died'})")
        recovery = self.failover.recover(dead, detected, lambda survivors: self._launch_surviving(
            self.committer.latest_manifest(), recovering=True, survivors=survivors))
        if why is not None:
            recovery.kind = f"global (fallback: {why})"
        voted = None if self.dissents is None else self.dissents.take_kind()
        if voted is not None:
            recovery.kind = voted
        self._inject("after_restore")

    def _fail_over(self, dead: Optional[set], detected: Optional[float]) -> tuple:
        """replicas > 1: a replica's death fails over to a live one, no restore (replica_failover.py),
        then each instance that lost one gets a replacement (replica_replacement.py): ``(None,
        dead)``. Else ``(why not, what the global rollback or a local recovery replaces)``."""
        why = self.replicas.refusal(dead)
        if why is None:
            try:
                victims = sorted({self.launcher.replicas.find(name)[0] for name in dead})
                self.replicas.recover(dead, detected or time.time())
                for victim in victims:
                    self.replacement.replace(victim, detected or time.time())  # its actor starts; _watch goes on once it is up
                self._inject("after_restore")
                return None, dead
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                return f"an actor died during the failover ({type(exc).__name__})", None
        return why, dead

    def _trim_sent(self, manifest: Manifest) -> None:
        """recovery="local": snapshot T committed, a restore starts there: the instances' upstream
        logs keep what they sent at or after it (no reply awaited); so do the replicas that are not
        the primary, and their kept bundles."""
        t = tuple(manifest.t)
        for actor in self.launcher.handles[1:]:  # handles[0]: the acker
            actor.trim_sent.remote(t)

    def snapshot(self) -> Optional[SnapshotRecord]:
        """Take one snapshot and commit its manifest; None if the run is already complete."""
        return self.committer.snapshot(self.launcher.acker)

    def live_status(self, latency_since: Optional[float] = None, latency_samples: bool = False) -> dict:
        """The figures ``status()`` shows (see :meth:`.live_status.LiveStatus.read`), the
        rescales so far and the key groups each instance of a keyed stage owns."""
        plan = self.launcher.plan or self.plan
        status = dataclasses.replace(
            self.live.read(latency_since, latency_samples), parallelism=plan.parallelism, max_parallelism=plan.max_parallelism,
            rescales=self.rescaler.reports(), corrupt_snapshots=list(self.corrupt.records),
            dissents=[] if self.dissents is None else self.dissents.gather(),
            key_groups={name: [str(plan.key_group_range(Instance(s.index, i))) for i in range(s.parallelism)]
                        for s in plan.keyed_stages for name in plan.keyed_names(s)})
        return status.to_dict()

    def _inject(self, moment: str) -> None:
        """Kill the next actor ``faults`` names for ``moment``, if any (tests only)."""
        names = self.faults.get(moment)
        if names:
            name = names.pop(0)
            found = self.launcher.handles_of([name])
            handle = found[0] if found else ray.get_actor(name, namespace=NAMESPACE)
            ray.kill(handle, no_restart=True)

    def request_rescale(self, parallelism: int):
        """See :meth:`.rescaler.Rescaler.request`; what replicas cannot take is refused (:meth:`RunConfig.refuse_rescale`)."""
        self.config.refuse_rescale(self.plan.with_parallelism(parallelism))
        return self.rescaler.request(self.plan, parallelism)

    def shutdown(self) -> list:
        """Kill the run's actors and standbys, but retire its warm actors; close the snapshot
        inbox and commit hooks. Returns the names of the warm actors that retired (they are
        the driver's again, see :func:`.warm_actors.hand_back`)."""
        handles, names = self.standbys.release()
        handles, names = self.launcher.handles + handles, self.launcher.actor_names(self.launcher.names) + names
        if self.launcher.warm_acker is not None:  # handed to a launch that never came
            handles, names = handles + [self.launcher.warm_acker[0]], names + [self.launcher.warm_acker[1]]
        warm = [name.startswith(WARM_PREFIX) for name in names]
        kill_actors([h for h, w in zip(handles, warm) if not w], [n for n, w in zip(names, warm) if not w])
        retired = retire([h for h, w in zip(handles, warm) if w], [n for n, w in zip(names, warm) if w])
        # Instances killed before they reported left their RocksDB files (on this node: a
        # cluster's other nodes clean up when an instance of the same name starts there), those
        # a rescale killed too, whose stage the plan may no longer have (a fused one at 1).
        remove_dead_workdirs(sorted(self.participants))
        if self.launcher.replicas is not None:
            self.replacement.close()
            self.launcher.replicas.close()
        self.launcher.close_verifier()
        self.committer.close()
        return retired


def restores_of(recoveries: list, plan: Plan) -> dict:
    """Per instance label, how many recoveries restored it (a global one: every instance; a
    local one: the instance it replaced). ``metrics.restores``, as the simulator's.

    >>> from types import SimpleNamespace as NS
    >>> restores_of([NS(restored=None), NS(restored=["1/0"])], NS(instances=[NS(label="0/0"), NS(label="1/0")]))
    {'0/0': 1, '1/0': 2}
    """
    counts: dict = {}
    for r in recoveries:
        for label in (r.restored if r.restored is not None else [i.label for i in plan.instances]):
            counts[label] = counts.get(label, 0) + 1
    return counts
