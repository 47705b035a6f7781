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
  against the flow, and the parallelism); :class:`~.rescaler.Drain` takes the drained
  snapshots a rescale and a stop end with.

The watch loop (:meth:`RaySupervisor.run`) waits on the acker's end of the run and on a
never-returning ``alive()`` call on every actor, commits snapshots as they arrive, and
hands a death, a hung actor or a stop to the part that deals with it.

>>> supervisor = RaySupervisor(flow.plan(parallelism=2), RunConfig(guarantee="exactly-once"))  # doctest: +SKIP
>>> result = supervisor.run(timeout=60)                                                       # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Callable, Optional

import ray

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.recovery import RecoveryRules
from driftstream.engine.model.result import RunResult, merge_instances
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.reassignment import reassigned
from driftstream.engine.control.failover import Failover, Heartbeat, Hung
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.live_status import LiveStatus, SupervisorStatus
from driftstream.engine.control.rescaler import Drain, Rescale
from driftstream.engine.control.resume import check_sinks, source_partitions, start_point
from driftstream.engine.control.snapshot_committer import SnapshotCommitter
from driftstream.engine.control.snapshot_log import SnapshotRecord
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors

log = logging.getLogger(__name__)

#: Seconds between two drains a rescale tries while the sinks hold output the replay has not
#: caught up with (reading goes on in between).
DRAIN_RETRY_S = 0.5

#: Seconds a stop tries drained snapshots (the sinks hold output past a recovery's snapshot
#: until the replay catches up) before it takes a plain final snapshot instead.
STOP_DRAIN_S = 30.0


class RescaleRequest:
    """A pending rescale to ``parallelism``: ``done`` is set with its ``report`` or ``error``
    (``internal``: one the run asked itself, a resume at another parallelism catching up)."""

    def __init__(self, parallelism: int, internal: bool = False) -> None:
        self.parallelism = parallelism
        self.internal = internal
        self.done = threading.Event()
        self.report: Optional[dict] = None
        self.error: Optional[BaseException] = None
        self.not_before = 0.0

    def finish(self, report: Optional[dict] = None, error: Optional[BaseException] = None) -> None:
        self.report, self.error = report, error
        self.done.set()


class RaySupervisor:
    """Runs one plan on Ray with a delivery guarantee. ``run()`` returns when bounded sources are done."""

    def __init__(self, plan: Plan, config: RunConfig) -> None:
        self.plan = plan
        self.config = config
        # Test-only fault injection: {"before_commit" | "after_restore" | "rescale_restore": [actor name, ...]}; each
        # entry is a real ray.kill of that actor at that moment of the protocol, used once.
        self.faults: dict = {k: list(v) for k, v in config.faults.items()}
        self.stop_requested = threading.Event()
        self.committer = SnapshotCommitter(plan, config, before_commit=functools.partial(self._inject, "before_commit"))
        self.snapshot_dir: Optional[str] = self.committer.snapshot_dir
        self.standbys = StandbyPool(config.standbys)
        self.launcher = Launcher(RecoveryRules(config, self.snapshot_dir), self.standbys)
        self.failover = Failover(self.launcher, self.standbys)
        self.live = LiveStatus(self.launcher, self.committer, self.failover)
        self.drain = Drain(self.launcher, self.committer)
        self.rescales: list = []  # Rescale records, oldest first
        self._rescale: Optional[RescaleRequest] = None
        self._lock = threading.Lock()

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
            check_sinks(self.plan)
            self._rescale = RescaleRequest(start.rescale_to, internal=True)
        self._switch_plan(start.plan)
        check_sinks(self.plan)
        manifest = start.manifest
        t0 = time.time()
        # A resumed run's sinks may hold output past the manifest (or output without any manifest).
        self._launch_surviving(manifest, recovering=self.config.resume)
        self.standbys.replenish(self.plan)
        if on_launched is not None:
            on_launched()
        deadline = None if timeout is None else t0 + timeout
        while True:
            outcome, detail = self._watch(deadline)
            if outcome == "rescale":
                try:
                    self._rescale_now()
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
        self._end_rescale(error=RuntimeError(f"the run ended ({outcome}) before the rescale"))
        wall = time.time() - t0
        if outcome == "error":
            raise detail
        self.failover.resolve()
        reports = detail if outcome == "done" else self.launcher.reports()
        result = merge_instances(reports, wall, [s.name for s in self.plan.steps if s.kind == "sink"])
        status, m = self.status, result.metrics
        m.snapshots, m.snapshot_failures = status.committed, status.snapshot_failures
        m.recoveries, m.skipped = len(status.recoveries), status.skipped
        m.recovery_s = [
            {"detected_at": r.detected_at, "restored": r.restored_s, "first_output": r.first_output_s, "snapshot": r.snapshot_id,
             "steps": dict(r.steps_s), "resets": dict(r.resets_s)}
            for r in status.recoveries
        ]
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
                ready, _ = ray.wait([done_ref] + alive, num_returns=1, timeout=committer.wait())
                try:
                    hung = heartbeat.hung(run.names, run.handles)
                    if hung and committer.takes_snapshots:
                        raise Hung(hung)
                    if done_ref in ready:
                        error = ray.get(done_ref)
                        if error is None:
                            return "done", run.reports()
                        if isinstance(error, ray.exceptions.RayActorError) and committer.takes_snapshots:
                            return "died", self.failover.confirm(alive)  # a stage died while releasing the end
                        return "error", error
                    committer.commit_arrived(run.acker)
                    if ready:
                        return "died", self.failover.confirm(alive)
                    if self.stop_requested.is_set():
                        self._final_snapshot()
                        return "stopped", None
                    if self._rescale is not None and time.time() >= self._rescale.not_before:
                        committer.finish_schedule(run.acker)
                        return "rescale", None
                    if deadline is not None and time.time() > deadline:
                        return "error", TimeoutError("run did not finish in time")
                    committer.start_when_due(run.acker)
                    if self.standbys.due():
                        self.standbys.replenish(self.plan)
                except ray.exceptions.RayActorError:
                    return "died", self.failover.confirm(alive)
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
        for attempt in range(attempts):
            try:
                run.launch(self.plan, manifest, recovering, survivors if attempt == 0 else None,
                           renamed=failover.take_renames(), avoid_nodes=failover.avoid_nodes)
                return manifest
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                # An actor died while the run starts: its call failed, or a peer's connection to it did.
                if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(exc.cause, OSError):
                    raise
                if not self.committer.takes_snapshots or attempt == attempts - 1:
                    raise
                failover.kill(run.handles, run.names)
                manifest, recovering = self.committer.latest_manifest(), True
                failover.count_restart(manifest)
        return manifest

    # -- rescaling ------------------------------------------------------------------------

    def request_rescale(self, parallelism: int) -> RescaleRequest:
        """Ask the watch loop to move the run to ``parallelism`` (see :mod:`.rescaler`); wait on
        the request's ``done``. A parallelism the flow or its sinks cannot take raises here,
        and the run goes on as it is."""
        if not self.committer.takes_snapshots:
            raise FlowError("a rescale restores from a snapshot: run the flow with a guarantee (e.g. guarantee='exactly-once')")
        check_sinks(self.plan.with_parallelism(parallelism))
        with self._lock:
            if self._rescale is not None:
                raise FlowError(f"flow {self.plan.flow_name!r} is already rescaling to {self._rescale.parallelism}")
            self._rescale = request = RescaleRequest(parallelism)
        return request

    def _rescale_now(self) -> None:
        """Drain, then restart every stage at the requested parallelism from the drained snapshot."""
        request, old = self._rescale, self.plan
        if request.parallelism == old.parallelism:
            self._end_rescale(report={"from": old.parallelism, "to": old.parallelism, "snapshot": None, "drain_s": 0.0,
                                      "restart_s": 0.0, "first_output_s": 0.0, "at": time.time()})
            return
        began = time.time()
        manifest = self.drain.snapshot()
        if manifest is None:  # the replay has not caught up with the sinks yet: reading goes on
            request.not_before = time.time() + DRAIN_RETRY_S
            return
        drained_at = time.time()
        new = old.with_parallelism(request.parallelism)
        moved = reassigned(manifest, new, self.committer.take_id(), source_partitions(new))
        self.committer.store.write_manifest(moved.snapshot_id, moved.to_json())
        written = time.time()
        self._inject("rescale_restore")  # tests: an actor dies as the rescale restarts the run
        run = self.launcher
        keep = {name: h for name, h in zip(run.names, run.handles) if name in {new.actor_name(i) for i in new.instances} | {run.names[0]}}
        gone = [name for name in run.names if name not in keep]
        kill_actors(run.handles_of(gone), [], wait_s=0)  # names the new plan does not use: nothing waits for them
        killed = time.time()
        self._switch_plan(new)
        self._launch_surviving(moved, recovering=True, survivors=keep)
        marks = run.marks  # the last launch's: begun, reset, connected, started
        steps = {"reassign": written - drained_at, "kill": killed - written}
        steps.update(zip(("reset", "connect", "start"), (b - a for a, b in zip(marks, marks[1:]))))
        record = Rescale(began, old.parallelism, new.parallelism, manifest.snapshot_id, drained_at - began, time.time() - drained_at,
                         pending=[a.first_release.remote() for a in run.sinks()], steps_s=steps, resets_s=dict(run.resets))
        self.rescales.append(record)
        log.info("flow %s rescaled from %d to %d instances from snapshot %d", new.flow_name, old.parallelism, new.parallelism,
                 manifest.snapshot_id)
        self._end_rescale(report=record)

    def _end_rescale(self, report=None, error: Optional[BaseException] = None) -> None:
        """Answer the pending request with ``report`` (a :class:`Rescale`, or a dict) or ``error``."""
        with self._lock:
            request, self._rescale = self._rescale, None
        if request is not None:
            request.finish(report, error)

    def _switch_plan(self, plan: Plan) -> None:
        self.plan = self.committer.plan = plan

    def _final_snapshot(self) -> None:
        """A stop's last snapshot: drained if the replay catches up with the sinks within
        STOP_DRAIN_S (a resume may then come at any parallelism), else a plain one."""
        committer = self.committer
        if not committer.takes_snapshots:
            return
        deadline = time.time() + STOP_DRAIN_S
        while time.time() < deadline:
            if self.drain.snapshot() is not None:
                return
            time.sleep(DRAIN_RETRY_S)
        log.warning("flow %s: the stop's snapshot is not drained (the sinks hold output the replay had not caught up "
                    "with after %.0f s): a resume at another parallelism first catches up at this one", self.plan.flow_name, STOP_DRAIN_S)
        committer.final_snapshot(self.launcher.acker)

    def recover(self, dead: Optional[set] = None, detected: Optional[float] = None) -> None:
        """Restart the run from the newest manifest: replace the ``dead`` actors, reset the others."""
        self.failover.recover(dead, detected, lambda survivors: self._launch_surviving(
            self.committer.latest_manifest(), recovering=True, survivors=survivors))
        self._inject("after_restore")

    def snapshot(self) -> Optional[SnapshotRecord]:
        """Take one snapshot and commit its manifest; None if the run is already complete."""
        return self.committer.snapshot(self.launcher.acker)

    def live_status(self, latency_since: Optional[float] = None, latency_samples: bool = False) -> dict:
        """The figures ``status()`` shows (see :meth:`.live_status.LiveStatus.read`), the
        rescales so far and the key groups each instance of a keyed stage owns."""
        plan = self.launcher.plan or self.plan
        return dict(self.live.read(latency_since, latency_samples), parallelism=plan.parallelism, max_parallelism=plan.max_parallelism,
                    rescales=self.rescale_reports(),
                    key_groups={s.name: [str(plan.key_group_range(Instance(s.index, i))) for i in range(s.parallelism)]
                                for s in plan.keyed_stages})

    def _inject(self, moment: str) -> None:
        """Kill the next actor ``faults`` names for ``moment``, if any (tests only)."""
        names = self.faults.get(moment)
        if names:
            name = names.pop(0)
            found = self.launcher.handles_of([name])
            handle = found[0] if found else ray.get_actor(name, namespace=NAMESPACE)
            ray.kill(handle, no_restart=True)

    def rescale_reports(self) -> list:
        """Every rescale so far (see :class:`~.rescaler.Rescale`)."""
        for r in self.rescales:
            r.resolve()
        return [r.report() for r in self.rescales]

    def shutdown(self) -> None:
        """Kill the run's actors and standbys; close the snapshot inbox and commit hooks."""
        handles, names = self.standbys.release()
        kill_actors(self.launcher.handles + handles, self.launcher.actor_names(self.launcher.names) + names)
        self.committer.close()
