"""The driver side of a run on Ray: launch the actors, take snapshots, recover from failures.

Snapshots are acker-based and asynchronous: the supervisor asks the acker to
attach ``snapshot(id)`` to the current watermark T; every stage instance
checkpoints its keyed state (everything below T), notes where its source
partitions replay from, uploads in the background, and answers ``prepared``;
then the manifest is written atomically. Output never waits for any of it.

Recovery: an actor's death is seen at once (the supervisor holds a
never-returning ``alive()`` call on every actor). Every actor of the run is
stopped and started again from the newest manifest; under exactly-once each
barrier first asks its sink for the last bundle it holds and drops replayed
output at or before it.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import ray

from driftstream.snapshots.store import SnapshotStore

from .errors import FlowError
from .plan import Plan
from .result import RunResult, merge_instances

GUARANTEES = ("exactly-once", "at-least-once", "none")


@dataclass
class Recovery:
    """Timings of one recovery, in seconds from the failure being detected."""

    detected_at: float
    restored_s: float = 0.0
    snapshot_id: Optional[int] = None


@dataclass
class SnapshotRecord:
    snapshot_id: int
    t: tuple
    duration_s: float


@dataclass
class SupervisorStatus:
    snapshots: list = field(default_factory=list)
    recoveries: list = field(default_factory=list)


def default_snapshot_dir(flow_name: str) -> str:
    """Where snapshots go when no snapshot_dir is given: a local directory per flow."""
    return os.path.join(tempfile.gettempdir(), "driftstream-snapshots", flow_name)


class RaySupervisor:
    """Runs one plan on Ray with a delivery guarantee. ``run()`` returns when bounded sources are done."""

    def __init__(
        self,
        plan: Plan,
        options: dict,
        guarantee: str = "none",
        snapshot_interval: float = 1.0,
        snapshot_dir: Optional[str] = None,
        resume: bool = False,
        seed: Optional[int] = None,
    ) -> None:
        if guarantee not in GUARANTEES:
            raise FlowError(f"guarantee must be one of {', '.join(GUARANTEES)}; got {guarantee!r}")
        self.plan = plan
        self.options = options
        self.guarantee = guarantee
        self.snapshot_interval = snapshot_interval
        self.seed = seed
        self.store: Optional[SnapshotStore] = None
        self.snapshot_dir: Optional[str] = None
        if guarantee != "none":
            self.snapshot_dir = snapshot_dir or default_snapshot_dir(plan.flow_name)
            self.store = SnapshotStore(self.snapshot_dir)
            if not resume:
                for sid in self.store.snapshot_ids():
                    self.store.delete_snapshot(sid)
        self.resume = resume
        self.status = SupervisorStatus()
        self.handles: list = []
        self.acker = None
        self.actors: dict = {}
        self.next_snapshot_id = 1

    # -- lifecycle ------------------------------------------------------------------------

    def launch(self, manifest: Optional[dict], recovering: bool) -> None:
        """Create the acker and every stage actor, restored from ``manifest`` when given."""
        from .ray_runtime import NAMESPACE, AckerActor, StageActor

        plan = self.plan
        spread = {"scheduling_strategy": "SPREAD"}
        token = secrets.token_bytes(32)
        self.acker = AckerActor.options(name=f"{plan.flow_name}/acker", namespace=NAMESPACE, **spread).remote(
            len(plan.source_instances), token
        )
        self.handles = [self.acker]
        self.actors = {}
        for s in plan.stages:
            for i in range(s.parallelism):
                key = f"{s.index}/{i}"
                opts = dict(
                    self.options,
                    seed=None if self.seed is None else self.seed * 1000 + len(self.actors),
                    snapshot_dir=self.snapshot_dir,
                    skip_released=recovering and self.guarantee == "exactly-once",
                    restore=_restore_for(manifest, key),
                )
                actor = StageActor.options(name=s.actor_names[i], namespace=NAMESPACE, **spread).remote(plan, s.index, i, opts, token)
                self.actors[(s.index, i)] = actor
                self.handles.append(actor)
        keys = list(self.actors)
        addresses = dict(zip(keys + ["acker"], ray.get([self.actors[k].listen.remote() for k in keys] + [self.acker.listen.remote()])))
        ray.get([a.connect.remote(self.acker, addresses) for a in self.actors.values()] + [self.acker.connect.remote(self.actors, addresses)])
        ray.get([a.start.remote() for a in self.actors.values()])

    def run(self, timeout: Optional[float] = None) -> RunResult:
        from .ray_runtime import _kill

        manifest = self.store.read_latest_manifest() if (self.resume and self.store) else None
        if manifest is not None:
            self.next_snapshot_id = manifest["id"] + 1
        t0 = time.time()
        self._launch_surviving(manifest, recovering=manifest is not None)
        deadline = None if timeout is None else t0 + timeout
        next_snapshot = time.time() + self.snapshot_interval
        while True:
            done_ref = self.acker.wait.remote()
            alive = [h.alive.remote() for h in self.handles]
            error: Optional[BaseException] = None
            died = False
            while True:
                wait_s = 1.0 if self.store is None else max(0.0, next_snapshot - time.time())
                ready, _ = ray.wait([done_ref] + alive, num_returns=1, timeout=wait_s)
                if done_ref in ready:
                    error = ray.get(done_ref)
                    break
                if ready:
                    died = True
                    break
                if deadline is not None and time.time() > deadline:
                    error = TimeoutError(f"run did not finish within {timeout}s")
                    break
                if self.store is not None and time.time() >= next_snapshot:
                    try:
                        self.snapshot()
                    except ray.exceptions.RayActorError:
                        died = True
                        break
                    next_snapshot = time.time() + self.snapshot_interval
            if not died:
                break
            if self.store is None:
                _kill(self.plan.flow_name, self.handles)
                raise RuntimeError("an actor of the run died and guarantee='none' takes no snapshots to recover from")
            self.recover()
        wall = time.time() - t0
        if error is not None:
            raise error
        reports = ray.get([a.report.remote() for a in self.actors.values()])
        result = merge_instances(reports, wall, [s.name for s in self.plan.steps if s.kind == "sink"])
        result.metrics.snapshots = len(self.status.snapshots)
        result.metrics.recoveries = len(self.status.recoveries)
        return result

    def _launch_surviving(self, manifest: Optional[dict], recovering: bool, attempts: int = 5) -> Optional[dict]:
        """Launch; if an actor dies while the run starts, start again (from the newest manifest)."""
        from .ray_runtime import _kill

        for attempt in range(attempts):
            try:
                self.launch(manifest, recovering)
                return manifest
            except ray.exceptions.RayActorError:
                if self.store is None or attempt == attempts - 1:
                    raise
                _kill(self.plan.flow_name, self.handles)
                manifest, recovering = self.store.read_latest_manifest(), True
                self.status.recoveries.append(Recovery(time.time(), 0.0, None if manifest is None else manifest["id"]))
        return manifest

    def snapshot(self) -> Optional[SnapshotRecord]:
        """Take one snapshot and commit its manifest; None if the run is already complete."""
        sid = self.next_snapshot_id
        started = time.time()
        t = ray.get(self.acker.snapshot.remote(sid))
        if t == (float("inf"),):
            return None
        self.next_snapshot_id += 1
        keys = list(self.actors)
        parts = ray.get([self.actors[k].prepared.remote(sid) for k in keys])
        manifest = {
            "id": sid,
            "flow": self.plan.flow_name,
            "parallelism": self.plan.parallelism,
            "t": list(t),
            "sources": {f"{k[0]}/{k[1]}": p["sources"] for k, p in zip(keys, parts) if p["sources"]},
            "states": {f"{k[0]}/{k[1]}": p["states"] for k, p in zip(keys, parts) if p["states"]},
        }
        self.store.write_manifest(sid, manifest)
        record = SnapshotRecord(sid, t, time.time() - started)
        self.status.snapshots.append(record)
        return record

    def recover(self) -> None:
        from .ray_runtime import _kill

        detected = time.time()
        _kill(self.plan.flow_name, self.handles)
        manifest = self._launch_surviving(self.store.read_latest_manifest(), recovering=True)
        self.status.recoveries.append(Recovery(detected, time.time() - detected, None if manifest is None else manifest["id"]))

    def shutdown(self) -> None:
        from .ray_runtime import _kill

        _kill(self.plan.flow_name, self.handles)


def _restore_for(manifest: Optional[dict], key: str) -> dict:
    if manifest is None:
        return {}
    sources = manifest.get("sources", {}).get(key)
    return {
        "snapshot": manifest["id"],
        "states": manifest.get("states", {}).get(key, {}),
        "sources": None if sources is None else {int(p): tuple(pos) for p, pos in sources.items()},
    }
