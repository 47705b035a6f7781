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
instances both plans have are reset in place with the new plan, the others killed or
started, key groups and source partitions reassigned
(:func:`~driftstream.engine.model.reassignment.reassigned`, committed first). A stop
takes the same drained snapshot, so that a resume may come at any parallelism.

>>> r = Rescale(at=100.0, from_=2, to=3, snapshot=7, drain_s=0.08, restart_s=0.4,
...             steps_s={"reassign": 0.01, "kill": 0.0, "reset": 0.1, "connect": 0.28, "start": 0.01})
>>> r.report()["to"], r.report()["first_output_s"], r.report()["steps_s"]["connect"]
(3, None, 0.28)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import ray

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.recovery import drained
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.snapshot_committer import SnapshotCommitter

#: Seconds between two looks at the acker while the watermark settles.
SETTLE_POLL_S = 0.005

#: Seconds a drain waits for the watermark to settle before it lets the sources read again.
SETTLE_TIMEOUT_S = 30.0


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
    snapshot: int
    drain_s: float
    restart_s: float
    first_output_s: Optional[float] = None
    pending: Optional[list] = None  # refs of first_release() calls, resolved lazily
    steps_s: dict = field(default_factory=dict)
    resets_s: dict = field(default_factory=dict)

    def resolve(self) -> None:
        """Fill in ``first_output_s`` once a sink has released output. O(sinks)."""
        pending = self.pending
        if pending:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
            times = []
            for ref in ready:
                try:
                    times.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    pass
            if times:
                self.first_output_s, self.pending = min(times) - self.at, None

    def wait_first_output(self, seconds: float) -> "Rescale":
        """This record once its first output has come, or ``seconds`` passed (without input none
        comes). Call it off the watch loop's thread (the coordinator's rescale call)."""
        deadline = time.time() + seconds
        while self.pending and time.time() < deadline:
            ray.wait(self.pending, num_returns=1, timeout=max(0.0, deadline - time.time()))
            self.resolve()
        return self

    def report(self) -> dict:
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
        ray.get([a.pause_reading.remote() for a in sources])
        deadline = time.time() + settle_timeout
        while True:
            status = ray.get(run.acker.status.remote())
            if status["settled"]:
                break
            if time.time() > deadline:
                self.resume()
                return None
            time.sleep(SETTLE_POLL_S)
        horizons = ray.get([a.t_last.remote() for a in run.actors.values()])
        if not drained(status["watermark"], horizons):
            self.resume()
            return None
        if committer.snapshot(run.acker) is None:
            return None  # the run is complete: nothing left to restore
        return committer.latest_manifest()

    def resume(self) -> None:
        """Let the sources read again (a drain given up on)."""
        ray.get([a.resume_reading.remote() for a in self._sources()])

    def _sources(self) -> list:
        plan = self.launcher.plan
        return [a for k, a in self.launcher.actors.items() if plan.stages[k.stage].source_id >= 0]
