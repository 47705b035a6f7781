"""Moving a running flow to another parallelism, and the drained snapshot it starts from.

A *drained* snapshot leaves the sinks holding exactly the output below its time T:

1. the sources stop reading (``pause_reading``: what they read is sent, with its bound);
2. the acker's watermark settles where the bounds let it go (nothing read is in flight
   below them); with the sources stopped it stays there, so nothing at or past it is
   released, ever;
3. no sink holds output at or past the watermark from before the last recovery (each
   barrier's ``t_last``: the replay has caught up); otherwise reading goes on and the
   drain is tried again later;
4. the snapshot is taken at that watermark and committed.

A rescale then restarts every stage at the new parallelism from it: the acker and the
instances both plans have are reset in place with the new plan (with replicas, their replicas
too: every replica of an instance restores the instance's part, as after a global rollback), the
others killed or started, key groups and source partitions reassigned
(:func:`~driftstream.engine.model.reassignment.reassigned`, committed first). A stop
takes the same drained snapshot, so that a resume may come at any parallelism.

>>> r = Rescale(at=100.0, from_=2, to=3, snapshot=7, drain_s=0.08, restart_s=0.4,
...             steps_s={"reassign": 0.01, "kill": 0.0, "reset": 0.1, "connect": 0.28, "start": 0.01})
>>> r.report()["to"], r.report()["first_output_s"], r.report()["steps_s"]["connect"]
(3, None, 0.28)
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import ray

from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.reassignment import reassigned
from driftstream.engine.model.recovery import drained
from driftstream.engine.control.launcher import Launcher, first_release_of
from driftstream.engine.control.resume import check_sinks, source_partitions
from driftstream.engine.control.snapshot_committer import SnapshotCommitter
from driftstream.engine.runtime.ray_session import kill_actors

log = logging.getLogger(__name__)

#: Seconds between two looks at the acker while the watermark settles.
SETTLE_POLL_S = 0.005

#: Seconds a drain waits for the watermark to settle before it lets the sources read again.
SETTLE_TIMEOUT_S = 30.0

#: Seconds between two drains a rescale tries while the sinks hold output the replay has not
#: caught up with (reading goes on in between).
DRAIN_RETRY_S = 0.5

#: Seconds a stop tries drained snapshots (the sinks hold output past a recovery's snapshot
#: until the replay catches up) before it takes a plain final snapshot instead.
STOP_DRAIN_S = 30.0


@dataclass
class Rescale:
    """One rescale: when it began (wall time), from and to which parallelism, the drained
    snapshot it restarted from, seconds from the sources' stop to that snapshot's commit
    (``drain_s``), from there to every actor running again (``restart_s``), and from the
    sources' stop to the first output released after it (``first_output_s``: the downtime
    as the sinks see it; None until then).

    ``steps_s``: where ``restart_s`` went, in seconds: ``reassign`` (the manifest reassigned
    to the new parallelism and committed), ``kill`` (the actors the new plan does not use),
    then the launch's ``reset`` (survivors reset in place, new actors created),
    ``connect`` (every actor listening, which waits for a new actor's process to start,
    and connected) and ``start``; ``resets_s``: per survivor reset in place, its
    ``tear_down``, ``setup`` and ``restore``, as a recovery's."""

    at: float
    from_: int
    to: int
    snapshot: Optional[int]  # None: already at that parallelism, nothing was done
    drain_s: float
    restart_s: float
    first_output_s: Optional[float] = None
    pending: Optional[list] = None  # refs of first_release() calls, resolved lazily
    steps_s: dict = field(default_factory=dict)
    resets_s: dict = field(default_factory=dict)

    def resolve(self) -> None:
        """Fill in ``first_output_s`` once a sink has released output. O(sinks)."""
        pending = self.pending
        first = first_release_of(pending) if pending else None
        if first is not None:
            self.first_output_s, self.pending = first - self.at, None

    def wait_first_output(self, seconds: float) -> "Rescale":
        """This record once its first output has come, or ``seconds`` passed (without input none
        comes). Call it off the watch loop's thread (the coordinator's rescale call)."""
        deadline = time.time() + seconds
        while self.pending and time.time() < deadline:
            ray.wait(self.pending, num_returns=1, timeout=max(0.0, deadline - time.time()))
            self.resolve()
        return self

    def report(self) -> dict:
        """The record as ``rescale()`` returns it and ``status()["rescales"]`` holds it (one form)."""
        return {"at": self.at, "from": self.from_, "to": self.to, "snapshot": self.snapshot, "drain_s": self.drain_s,
                "restart_s": self.restart_s, "first_output_s": self.first_output_s, "steps_s": dict(self.steps_s),
                "resets_s": dict(self.resets_s)}


class Drain:
    """Takes drained snapshots of ``launcher``'s run through ``committer``."""

    def __init__(self, launcher: Launcher, committer: SnapshotCommitter) -> None:
        self.launcher = launcher
        self.committer = committer

    def snapshot(self, settle_timeout: float = SETTLE_TIMEOUT_S) -> Optional[Manifest]:
        """Steps 1-4 of the module doc: the committed drained snapshot, or None when the
        sinks hold output a recovery has not replayed yet or the watermark did not settle
        (the sources read again then). The sources stay stopped after a success.
        Raises RayActorError if an actor dies meanwhile."""
        run, committer = self.launcher, self.committer
        committer.finish_schedule(run.acker)
        sources = self._sources()
        last_bounds = [b for b in ray.get([a.pause_reading.remote() for a in sources]) if b is not None]
        deadline = time.time() + settle_timeout
        while True:
            status = ray.get(run.acker.status.remote())
            # Settled with the sources' last bounds in: a bound still on its way would move it.
            if status["settled"] and all(bound is None or status["bounds"][i] == bound for i, bound in last_bounds):
                break
            if time.time() > deadline:
                self.resume()
                return None
            time.sleep(SETTLE_POLL_S)
        horizons = ray.get([a.t_last.remote() for a in run.actors.values()])
        if not drained(status["watermark"], horizons):
            self.resume()
            return None
        if committer.snapshot(run.acker, certified=True) is None:
            return None  # the run is complete: nothing left to restore
        return committer.latest_manifest()

    def resume(self) -> None:
        """Let the sources read again (a drain given up on)."""
        ray.get([a.resume_reading.remote() for a in self._sources()])

    def _sources(self) -> list:
        plan = self.launcher.plan
        return [a for k, a in self.launcher.actors.items() if plan.stages[k.stage].source_id >= 0]


class RescaleRequest:
    """A pending rescale to ``parallelism``: ``done`` is set with its ``report`` (a
    :class:`Rescale`, or a dict when nothing had to move) or ``error``."""

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.done = threading.Event()
        self.report = None
        self.error: Optional[BaseException] = None
        self.not_before = 0.0  # a drain given up on is tried again from then

    def finish(self, report=None, error: Optional[BaseException] = None) -> None:
        self.report, self.error = report, error
        self.done.set()


class Rescaler:
    """Moves ``launcher``'s run to another parallelism, one request at a time; the watch loop
    asks :meth:`due` at every turn and calls :meth:`run` when it is. ``relaunch(plan,
    manifest, survivors)`` launches the new plan; ``before_restart`` runs between the
    reassigned manifest's commit and that launch (tests inject a kill there)."""

    def __init__(self, launcher: Launcher, committer: SnapshotCommitter, relaunch: Callable[[Plan, Manifest, dict], None],
                 before_restart: Callable[[], None] = lambda: None) -> None:
        self.launcher = launcher
        self.committer = committer
        self.relaunch = relaunch
        self.before_restart = before_restart
        self.drain = Drain(launcher, committer)
        self.records: list = []  # every Rescale, oldest first
        self._pending: Optional[RescaleRequest] = None
        self._lock = threading.Lock()

    def request(self, plan: Plan, parallelism: int) -> RescaleRequest:
        """Ask for ``plan``'s run to move to ``parallelism``; wait on the request's ``done``. A
        parallelism the flow or its sinks cannot take raises here, and the run goes on."""
        if not self.committer.takes_snapshots:
            raise FlowError("a rescale restores from a snapshot: run the flow with a guarantee (e.g. guarantee='exactly-once')")
        check_sinks(plan.with_parallelism(parallelism))
        with self._lock:
            if self._pending is not None:
                raise FlowError(f"flow {plan.flow_name!r} is already rescaling to {self._pending.parallelism}")
            self._pending = request = RescaleRequest(parallelism)
        return request

    def catch_up_then(self, plan: Plan, parallelism: int) -> None:
        """A resume at the snapshot's parallelism (the sinks held output past it) that moves to
        ``parallelism`` once the replay has caught up: the drains fail until then."""
        self.request(plan, parallelism)

    def due(self) -> bool:
        pending = self._pending
        return pending is not None and time.time() >= pending.not_before

    def run(self, plan: Plan) -> None:
        """Drain, then restart every stage at the requested parallelism from the drained
        snapshot; if the sinks hold output the replay has not caught up with, try again in
        DRAIN_RETRY_S. RayActorError if an actor dies meanwhile (the request stays)."""
        request = self._pending
        if request.parallelism == plan.parallelism:
            self.end(report=Rescale(time.time(), plan.parallelism, plan.parallelism, None, 0.0, 0.0, first_output_s=0.0))
            return
        began = time.time()
        manifest = self.drain.snapshot()
        if manifest is None:  # the replay has not caught up with the sinks yet: reading goes on
            request.not_before = time.time() + DRAIN_RETRY_S
            return
        drained_at = time.time()
        new = plan.with_parallelism(request.parallelism)
        moved = reassigned(manifest, new, self.committer.take_id(certified=True), source_partitions(new))  # as certified as its source
        self.committer.store.write_manifest(moved.snapshot_id, moved.to_json())
        written = time.time()
        self.before_restart()
        run = self.launcher
        survivors = run.kept_by(new)  # with replicas, those of the instances kept too: each restores its part again
        gone = [name for name in run.names if name not in survivors]
        kill_actors(run.handles_of(gone), [], wait_s=0)  # names the new plan does not use: nothing waits for them
        killed = time.time()
        self.relaunch(new, moved, survivors)
        marks = run.marks  # the launch's: begun, reset, connected, started
        steps = {"reassign": written - drained_at, "kill": killed - written}
        steps.update(zip(("reset", "connect", "start"), (b - a for a, b in zip(marks, marks[1:]))))
        record = Rescale(began, plan.parallelism, new.parallelism, manifest.snapshot_id, drained_at - began, time.time() - drained_at,
                         pending=[a.first_release.remote() for a in run.sinks()], steps_s=steps, resets_s=dict(run.resets))
        self.records.append(record)
        log.info("flow %s rescaled from %d to %d instances from snapshot %d", new.flow_name, plan.parallelism, new.parallelism,
                 manifest.snapshot_id)
        self.end(report=record)

    def end(self, report=None, error: Optional[BaseException] = None) -> None:
        """Answer the pending request (if any) with ``report`` or ``error``."""
        with self._lock:
            request, self._pending = self._pending, None
        if request is not None:
            request.finish(report, error)

    def final_snapshot(self) -> None:
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
        log.warning("flow %s: the stop's snapshot is not drained (the sinks hold output the replay had not caught up with "
                    "after %.0f s): a resume at another parallelism first catches up at this one", committer.plan.flow_name, STOP_DRAIN_S)
        committer.final_snapshot(self.launcher.acker)

    def reports(self) -> list:
        """Every rescale so far (:meth:`Rescale.report`)."""
        for r in self.records:
            r.resolve()
        return [r.report() for r in self.records]
