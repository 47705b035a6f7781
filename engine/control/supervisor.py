"""The driver side of a run on Ray: launch the actors, take snapshots, recover from failures.

Snapshots are acker-based and asynchronous: the supervisor asks the acker to
attach ``snapshot(id)`` to the current watermark T; every stage instance
stores its keyed state (everything below T: a delta or a base checkpoint),
notes where its source partitions replay from, all in the background, and sends
its part (``prepared``) to the acker on the data plane; the acker answers the
supervisor with every part, and the manifest is written atomically. One call
to the acker takes every snapshot of a schedule and sends each to the supervisor
as it completes, a data-plane message (:mod:`.snapshot_stream`); the supervisor
goes on watching the actors meanwhile. Output never waits for any of it.

Recovery: an actor's death is seen at once (the supervisor holds a
never-returning ``alive()`` call on every actor). Every actor of the run is
stopped and started again from the newest manifest; under exactly-once each
barrier first asks its sink for the last bundle it holds and drops replayed
output at or before it.
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.live_figures import LATENCY_WINDOW_S, latencies_ms, watermark_lag_s, window_summary
from driftstream.engine.model.manifest import Manifest, MissingParts, SnapshotFailed, manifest_of
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.recovery import RecoveryRules, replay_limit
from driftstream.engine.model.result import RunResult, add_cache_stats, merge_instances, sum_per_step
from driftstream.engine.control.snapshot_stream import SnapshotInbox, SnapshotStream
from driftstream.engine.runtime.actors import AckerActor, StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors
from driftstream.engine.runtime.stage import TIMED_KINDS


#: While a snapshot schedule runs, the watch loop waits for the next snapshot this long
#: at most before it looks at the actors again: a death is seen within it.
POLL_S = 0.05

#: A failed snapshot (the store unwritable) is retried after the snapshot interval, doubling
#: at each failure in a row up to this many seconds.
SNAPSHOT_RETRY_MAX_S = 8.0

#: Committed snapshots whose record (id, t, duration) a run keeps for status() and metrics:
#: the last ones; the count is kept apart.
KEEP_SNAPSHOT_RECORDS = 1000

#: Seconds after a recovery that used a standby before a new standby is started: its
#: process start (about a second of CPU) must not slow the replay that catches up.
STANDBY_REPLENISH_DELAY_S = 2.0

#: Seconds a recovery waits for a lost actor's name to be free before its replacement takes
#: another: Ray frees it at once for a killed actor, only after a health check (~14 s) for
#: one on a node that vanished.
NAME_WAIT_S = 1.0

#: After a first actor is seen dead, the others' alive() answers are awaited until none came
#: for CONFIRM_QUIET_S (the lost one's peers answer as their connections to it end, within
#: milliseconds), at most CONFIRM_S: one recovery then takes every actor one event killed.
#: A fixed wait of CONFIRM_S was 100 of the 220 ms from a kill to restored with a standby.
CONFIRM_QUIET_S, CONFIRM_S = 0.02, 0.1

#: Seconds a source's commit hook (a Kafka consumer group commit) may take to finish at shutdown.
COMMIT_HOOK_CLOSE_S = 5.0


class Hung(Exception):
    """Actors that did not answer within the heartbeat timeout: they are killed and replaced."""

    def __init__(self, names: set) -> None:
        super().__init__(f"no answer from {sorted(names)}")
        self.names = names


@dataclass
class Recovery:
    """One recovery: when the failure was detected (wall time), seconds from then until
    every actor was restored and running, and until the first new output was released."""

    detected_at: float
    restored_s: float = 0.0
    snapshot_id: Optional[int] = None
    first_output_s: Optional[float] = None
    pending: Optional[list] = None  # refs of first_release() calls, resolved lazily
    #: where ``restored_s`` went, in order: ``confirm`` (the other actors' answers: is anyone
    #: else lost?), ``probe`` (are their nodes alive?), ``kill`` (lost actors killed, names
    #: freed), ``reset`` (survivors reset in place, standbys and new actors restored),
    #: ``connect`` (data plane up, windows' timers seeded) and ``start`` (sources reading)
    steps_s: dict = field(default_factory=dict)
    #: per stage instance reset in place (a survivor, or a standby taking a lost one's place):
    #: seconds of ``tear_down``, ``setup`` and ``restore`` (within setup)
    resets_s: dict = field(default_factory=dict)


@dataclass
class SnapshotRecord:
    """A committed snapshot; ``duration_s``: from its marker until every part was durable
    (the manifest is committed right after)."""

    snapshot_id: int
    t: tuple
    duration_s: float
    requested_at: float = 0.0
    committed_at: float = 0.0


@dataclass
class SupervisorStatus:
    #: the last KEEP_SNAPSHOT_RECORDS committed snapshots; ``committed`` counts them all
    snapshots: deque = field(default_factory=lambda: deque(maxlen=KEEP_SNAPSHOT_RECORDS))
    committed: int = 0
    recoveries: list = field(default_factory=list)
    #: input records skipped by at-most-once recoveries (lost on purpose)
    skipped: int = 0
    #: snapshots that could not be written (the store failed), the last one's error, and
    #: since when they fail in a row (None: the last one was committed)
    snapshot_failures: int = 0
    failures_in_row: int = 0
    last_snapshot_error: Optional[str] = None
    failing_since: Optional[float] = None


def default_snapshot_dir(flow_name: str) -> str:
    """Where snapshots go when no snapshot_dir is given: a local directory per flow."""
    return os.path.join(tempfile.gettempdir(), "driftstream-snapshots", flow_name)


class RaySupervisor:
    """Runs one plan on Ray with a delivery guarantee. ``run()`` returns when bounded sources are done."""

    def __init__(self, plan: Plan, config: RunConfig) -> None:
        self.plan = plan
        self.config = config
        self.store: Optional[SnapshotStore] = None
        self.snapshot_dir: Optional[str] = None
        if config.takes_snapshots:
            self.snapshot_dir = config.snapshot_dir or default_snapshot_dir(plan.flow_name)
            # Pruning lists the store: about once a second, whatever the snapshot interval.
            self.store = SnapshotStore(self.snapshot_dir, prune_every=max(1, round(1.0 / config.snapshot_interval)))
            if not config.resume:
                for sid in self.store.snapshot_ids():
                    self.store.delete_snapshot(sid)
        self.rules = RecoveryRules(config, self.snapshot_dir)
        # Test-only fault injection: {"before_commit" | "after_restore": [actor name, ...]}; each
        # entry is a real ray.kill of that actor at that moment of the protocol, used once.
        self.faults: dict = {k: list(v) for k, v in config.faults.items()}
        self.stop_requested = threading.Event()
        self.status = SupervisorStatus()
        self.handles: list = []
        self.names: list = []
        self.acker = None
        self.actors: dict = {}
        self.next_snapshot_id = 1
        self.inbox: Optional[SnapshotInbox] = None  # where the acker sends snapshots, once a schedule started
        self.streams = 0  # schedules started: each stream's number
        #: started actors waiting to replace a lost instance: (handle, actor name)
        self.standbys: list = []
        self._resets: dict = {}  # the last launch's resets, by instance (see Recovery.resets_s)
        self._standbys_started = 0
        self._replenish_at = 0.0
        #: instance actor name -> the name of the actor playing it, where a standby took its place
        self.real_names: dict = {}
        #: actor name -> the Ray node it runs on; nodes that lost actors in the last recovery
        self.node_of: dict = {}
        self.avoid_nodes: set = set()
        #: for the next launch: actor name -> the name its new actor takes (the name still held)
        self.renamed: dict = {}
        self._renames = 0
        #: source stage -> what its source wants told of each committed snapshot (a Kafka consumer group)
        self.commit_hooks: dict = {}
        if self.store is not None:
            for stage in plan.stages:
                hook = plan.steps[stage.source_id].source.commit_hook() if stage.source_id >= 0 else None
                if hook is not None:
                    self.commit_hooks[stage.index] = hook

    # -- lifecycle ------------------------------------------------------------------------

    def launch(self, manifest: Optional[Manifest], recovering: bool, survivors: Optional[dict] = None) -> None:
        """Start the acker and every stage actor, restored from ``manifest`` when given.

        ``survivors`` (actor name -> handle) are reset in place instead of replaced:
        a new process costs ~1 s of CPU on a small machine, a reset milliseconds.
        """
        plan = self.plan
        survivors = survivors or {}
        marks = self._launch_marks = [time.time()]
        placed = self._placement()
        token = secrets.token_bytes(32)
        resets: list = []
        reset_names: list = []
        acker_name = f"{plan.flow_name}/acker"
        if acker_name in survivors:
            self.acker = survivors[acker_name]
            resets.append(self.acker.reset.remote(len(plan.source_instances), token))
        else:
            self.acker = AckerActor.options(name=self.renamed.get(acker_name, acker_name), namespace=NAMESPACE,
                                            scheduling_strategy=next(placed)).remote(len(plan.source_instances), token)
        handles, names, actors, real_names = [self.acker], [acker_name], {}, {}
        if acker_name in self.renamed:
            real_names[acker_name] = self.renamed[acker_name]
        elif acker_name in survivors and acker_name in self.real_names:
            real_names[acker_name] = self.real_names[acker_name]
        for ordinal, instance in enumerate(plan.instances):
            opts = self.rules.instance_config(instance, ordinal, manifest, recovering)
            name = plan.actor_name(instance)
            if name in survivors:
                actor = survivors[name]
                resets.append(actor.reset.remote(opts, token))
                reset_names.append(name)
                if name in self.real_names:
                    real_names[name] = self.real_names[name]
            elif self.standbys:
                actor, real_names[name], _ = self.standbys.pop(0)
                resets.append(actor.reset.remote(opts, token, tuple(instance)))
                reset_names.append(f"{name} (standby)")
            else:
                real = real_names[name] = self.renamed.get(name, name)
                actor = StageActor.options(name=real, namespace=NAMESPACE, scheduling_strategy=next(placed)).remote(plan, *instance, opts, token)
            actors[instance] = actor
            handles.append(actor)
            names.append(name)
        # The coordinator answers status() on other threads while this runs: they must see the
        # old set of actors or the whole new one, never a dict that is being filled.
        self.actors, self.handles, self.names, self.real_names = actors, handles, names, real_names
        self.renamed = {}
        # Stage instances say where their reset went (the acker's, listed first if reset, says nothing).
        self._resets = {n: t for n, t in zip(reset_names, ray.get(resets)[len(resets) - len(reset_names):])}
        marks.append(time.time())
        keys = list(self.actors)
        answers = ray.get([self.actors[k].listen.remote() for k in keys] + [self.acker.listen.remote()] + [h.node.remote() for h in handles])
        addresses = dict(zip(keys + ["acker"], answers[: len(keys) + 1]))
        self.node_of = dict(zip(names, answers[len(keys) + 1:]))
        ray.get([a.connect.remote(self.acker, addresses) for a in self.actors.values()] + [self.acker.connect.remote(self.actors, addresses)])
        # Restored windows' timers reach the acker before any source starts: the watermark
        # must not pass a close time whose windows have not been emitted.
        seeds = [x for x in ray.get([a.take_seed.remote() for a in self.actors.values()]) if x]
        if seeds:
            ray.get(self.acker.seed.remote(seeds))
        marks.append(time.time())
        skip_after = None
        if recovering and self.rules.skips_backlog:
            skip_after = replay_limit(ray.get([a.t_last.remote() for a in self.actors.values()]))
        self.status.skipped += sum(ray.get([a.start.remote(skip_after) for a in self.actors.values()]))
        marks.append(time.time())

    def run(self, timeout: Optional[float] = None, on_launched=None) -> RunResult:
        manifest = self._latest_manifest() if self.config.resume else None
        if manifest is not None:
            # Past every snapshot directory, committed or not: a new snapshot never shares one
            # with files an earlier run left behind.
            self.next_snapshot_id = max([manifest.snapshot_id, *self.store.snapshot_ids()]) + 1
        t0 = time.time()
        # A resumed run's sinks may hold output past the manifest (or output without any manifest).
        self._launch_surviving(manifest, recovering=self.config.resume)
        self._replenish()
        if on_launched is not None:
            on_launched()
        deadline = None if timeout is None else t0 + timeout
        while True:
            outcome, detail = self._watch(deadline)
            if outcome != "died":
                break
            if self.store is None:
                kill_actors(self.handles, self.names)
                raise RuntimeError("an actor of the run died and guarantee='none' takes no snapshots to recover from")
            self.recover(*detail)
        wall = time.time() - t0
        if outcome == "error":
            raise detail
        self.resolve_recoveries()
        reports = detail if outcome == "done" else ray.get([a.report.remote() for a in self.actors.values()])
        result = merge_instances(reports, wall, [s.name for s in self.plan.steps if s.kind == "sink"])
        result.metrics.snapshots = self.status.committed
        result.metrics.snapshot_failures = self.status.snapshot_failures
        result.metrics.recoveries = len(self.status.recoveries)
        result.metrics.skipped = self.status.skipped
        result.metrics.recovery_s = [
            {"detected_at": r.detected_at, "restored": r.restored_s, "first_output": r.first_output_s, "snapshot": r.snapshot_id,
             "steps": dict(r.steps_s), "resets": dict(r.resets_s)}
            for r in self.status.recoveries
        ]
        result.metrics.snapshot_s = [r.duration_s for r in self.status.snapshots]
        result.metrics.snapshot_windows = [(r.requested_at, r.requested_at + r.duration_s) for r in self.status.snapshots]
        return result

    def _watch(self, deadline: Optional[float]) -> tuple:
        """Take snapshots on schedule until the run ends, fails, is stopped or loses an actor.

        Returns ``("done", reports)``, ``("stopped", None)``, ``("error", exception)`` or
        ``("died", (names of dead actors, wall time the death was seen))``.
        """
        done_ref = self.acker.wait.remote()
        alive = [h.alive.remote() for h in self.handles]

        def dead() -> tuple:
            seen = time.time()
            # A call that saw the death may beat the alive() ref; actors that shared the dead
            # one's node go a few milliseconds apart: take them all in one recovery.
            ready, _ = ray.wait(alive, num_returns=1, timeout=2.0)
            settle_answers(alive, len(ready), seen + CONFIRM_S)
            return "died", (self._lost(alive), seen)

        next_snapshot = time.time() + self.config.snapshot_interval
        pings: dict = {}  # actor name -> (ping ref, sent at): the heartbeat
        stream: Optional[SnapshotStream] = None  # the acker's snapshots, once started
        try:
            while True:
                if stream is None:
                    wait_s = 0.2 if self.store is None else min(0.2, max(0.0, next_snapshot - time.time()))
                    ready, _ = ray.wait([done_ref] + alive, num_returns=1, timeout=wait_s)
                else:  # snapshots arrive on the data plane, not as Ray refs: wait for one, then look
                    stream.wait(POLL_S)
                    ready, _ = ray.wait([done_ref] + alive, num_returns=1, timeout=0)
                try:
                    hung = self._heartbeat(pings)
                    if hung:
                        raise Hung(hung)
                    if done_ref in ready:
                        error = ray.get(done_ref)
                        if error is None:
                            return "done", ray.get([a.report.remote() for a in self.actors.values()])
                        if isinstance(error, ray.exceptions.RayActorError) and self.store is not None:
                            return dead()  # a stage died while releasing the end
                        return "error", error
                    if stream is not None and stream.wait(0):
                        item = stream.take()
                        if item is None:  # the run is complete: done_ref follows
                            self._drop(stream)
                            stream, next_snapshot = None, float("inf")
                        elif not self._commit_or_defer(item):
                            # The store failed: end the schedule, start another after a backoff.
                            self._drain(stream, tolerant=True)
                            stream, next_snapshot = None, self._retry_at()
                    elif stream is not None:
                        self._check_on_time(stream)
                    if ready:
                        return dead()
                    if self.stop_requested.is_set():
                        if self.store is not None:
                            self._drain(stream)
                            stream = None
                            self.snapshot()  # the final snapshot: a resume starts from here
                        return "stopped", None
                    if deadline is not None and time.time() > deadline:
                        return "error", TimeoutError("run did not finish in time")
                    if self.store is not None and stream is None and time.time() >= next_snapshot:
                        stream = self._stream(count=None)
                    if len(self.standbys) < self.config.standbys and time.time() >= self._replenish_at:
                        self._replenish()
                except ray.exceptions.RayActorError:
                    return dead()
                except Hung as exc:
                    kill_actors([h for n, h in zip(self.names, self.handles) if n in exc.names], sorted(exc.names))
                    return "died", (exc.names, time.time())
        finally:
            if stream is not None:
                self._drop(stream)

    def _heartbeat(self, pings: dict) -> set:
        """Ping every actor about once a second; return the names of those that have not
        answered for ``heartbeat_timeout`` seconds (hung, e.g. a user function that never returns).

        One ``ray.wait`` over every outstanding ping per call: the watch loop runs this at
        every turn, a turn per snapshot interval or less."""
        now = time.time()
        outstanding = [sent[0] for sent in pings.values()]
        answered = set(ray.wait(outstanding, num_returns=len(outstanding), timeout=0)[0]) if outstanding else set()
        hung = set()
        for name, handle in zip(self.names, self.handles):
            sent = pings.get(name)
            if sent is None or (sent[0] in answered and now - sent[1] >= 1.0):
                pings[name] = (handle.ping.remote(), now)
            elif sent[0] not in answered and now - sent[1] > self.config.heartbeat_timeout:
                hung.add(name)
        return hung if self.store is not None else set()

    def _latest_manifest(self) -> Optional[Manifest]:
        """The newest committed manifest in the store, if any."""
        data = self.store.read_latest_manifest() if self.store is not None else None
        return None if data is None else Manifest.from_json(data)

    def _launch_surviving(
        self, manifest: Optional[Manifest], recovering: bool, attempts: int = 5, survivors: Optional[dict] = None
    ) -> Optional[Manifest]:
        """Launch; if an actor dies while the run starts, start again (from the newest manifest),
        this time with every actor new."""
        for attempt in range(attempts):
            try:
                self.launch(manifest, recovering, survivors if attempt == 0 else None)
                return manifest
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                # An actor died while the run starts: its call failed, or a peer's connection to it did.
                if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(exc.cause, OSError):
                    raise
                if self.store is None or attempt == attempts - 1:
                    raise
                self._kill(self.handles, self.names)
                manifest, recovering = self._latest_manifest(), True
                self.status.recoveries.append(Recovery(time.time(), 0.0, None if manifest is None else manifest.snapshot_id))
        return manifest

    def snapshot(self) -> Optional[SnapshotRecord]:
        """Take one snapshot and commit its manifest; None if the run is already complete."""
        stream = self._stream(count=1)
        try:
            item = self._take(stream)
        finally:
            self._drop(stream)
        return None if item is None else self._commit(item)

    def _stream(self, count: Optional[int]) -> SnapshotStream:
        """Start the acker's schedule of ``count`` snapshots (None: until the run completes)."""
        if self.inbox is None:
            self.inbox = SnapshotInbox(ray.util.get_node_ip_address())
        self.streams += 1
        # An item later than this means the acker hangs, as a single call's bound did.
        interval = self.config.snapshot_interval
        timeout = self.config.snapshot_timeout
        stream = SnapshotStream(self.inbox, self.streams, self.next_snapshot_id, patience=interval + timeout + 5)
        inbox = (self.inbox.address, self.inbox.token, stream.number)
        stream.call = self.acker.snapshots.remote(self.next_snapshot_id, count, interval, timeout, inbox)
        return stream

    def _take(self, stream: SnapshotStream) -> Optional[tuple]:
        """Block for ``stream``'s next snapshot (None: it ended). Hung past its deadline;
        RayActorError if the acker died (its schedule call fails)."""
        while not stream.wait(POLL_S):
            if ray.wait([stream.call], timeout=0)[0]:
                ray.get(stream.call)  # raises if the acker died; else its end is on the way
            self._check_on_time(stream)
        return stream.take()

    def _check_on_time(self, stream: SnapshotStream) -> None:
        """Hung (the acker) when ``stream``'s next snapshot is overdue: the acker answers
        pings, but its schedule went silent (e.g. its link to the inbox is gone)."""
        if stream.overdue():
            raise Hung({self.names[0]})

    def _drop(self, stream: SnapshotStream) -> None:
        """Forget ``stream``: later snapshots take ids past any it may have begun."""
        self.next_snapshot_id = max(self.next_snapshot_id, stream.next_id + 1)

    def _drain(self, stream: Optional[SnapshotStream], tolerant: bool = False) -> None:
        """End ``stream``'s schedule and commit what it still yields (a stop); ``tolerant``:
        a snapshot the store fails is counted, not raised."""
        if stream is None:
            return
        ray.get(self.acker.end_snapshots.remote())
        while (item := self._take(stream)) is not None:
            if tolerant:
                self._commit_or_defer(item)
            else:
                self._commit(item)
        self._drop(stream)

    def _commit_or_defer(self, item: tuple) -> bool:
        """Commit ``item``; False if the store failed it (a part or the manifest could not be
        written). Processing and output go on meanwhile; past ``snapshot_failure_timeout``
        seconds of failures in a row, SnapshotFailed stops the run, since a recovery would
        replay everything since the last committed snapshot."""
        try:
            self._commit(item)
            return True
        except (SnapshotFailed, OSError) as exc:
            st, now = self.status, time.time()
            st.snapshot_failures += 1
            st.failures_in_row += 1
            st.last_snapshot_error = f"{type(exc).__name__}: {exc}"
            st.failing_since = st.failing_since or now
            if now - st.failing_since > self.config.snapshot_failure_timeout:
                last = f"snapshot {st.snapshots[-1].snapshot_id}" if st.snapshots else "none"
                raise SnapshotFailed(
                    f"snapshots have failed for {now - st.failing_since:.0f} s (snapshot_failure_timeout="
                    f"{self.config.snapshot_failure_timeout:g}), the last with {st.last_snapshot_error}; the last committed "
                    f"snapshot: {last}. The run stops so that a recovery never replays more than that: "
                    "make the snapshot store writable, then start the flow again with resume=True") from exc
            return False

    def _retry_at(self) -> float:
        """When to try a snapshot again after failures: the interval, doubled per failure in a row."""
        backoff = self.config.snapshot_interval * 2 ** min(10, self.status.failures_in_row - 1)
        return time.time() + min(SNAPSHOT_RETRY_MAX_S, backoff)

    def _commit(self, item: tuple) -> SnapshotRecord:
        """Commit the manifest of one snapshot from the acker, ``(id, T, parts, missing,
        started, took_s)``. Raises Hung for actors that did not answer, SnapshotFailed for a
        part that could not be written."""
        sid, t, parts, missing, started, took_s = item
        try:
            manifest = manifest_of(self.plan, sid, t, parts, missing)
        except MissingParts as exc:
            raise Hung({self.plan.actor_name(i) for i in exc.instances}) from None
        self._inject("before_commit")
        self.store.write_manifest(sid, manifest.to_json())
        for stage, hook in self.commit_hooks.items():
            hook.submit(manifest.offsets(Instance(stage, i) for i in range(self.plan.stages[stage].parallelism)))
        record = SnapshotRecord(sid, t, took_s, started, time.time())
        self.status.snapshots.append(record)
        self.status.committed += 1
        self.status.failing_since, self.status.failures_in_row = None, 0
        return record

    def recover(self, dead: Optional[set] = None, detected: Optional[float] = None) -> None:
        """Restart the run from the newest manifest: replace the ``dead`` actors, reset the others."""
        entered = time.time()
        detected = detected or entered
        dead = set(self.names) if dead is None else dead
        # A node whose raylet does not answer is gone with every actor on it, though Ray says so
        # only after its health check (~14 s): its actors that still answer are dying too.
        gone = _unreachable_nodes({self.node_of[n] for n in self.names if n in self.node_of})
        dead |= {n for n in self.names if self.node_of.get(n) in gone}
        probed = time.time()
        lost = [n for n in self.names if n in dead]
        # A node with a surviving actor is alive; one whose actors all died may be gone (its
        # death known to Ray only after a health check): new actors go elsewhere.
        survived_on = {self.node_of.get(n) for n in self.names if n not in dead}
        self.avoid_nodes = {self.node_of[n] for n in lost if n in self.node_of} - survived_on
        # Only a name a new actor takes must be free first; a standby keeps its own.
        self._drop_standbys_on(self.avoid_nodes)
        by_standby = [n for n in lost if n != self.names[0]][:len(self.standbys)]  # names[0]: the acker
        self._kill([h for n, h in zip(self.names, self.handles) if n in dead], [n for n in lost if n not in by_standby])
        survivors = {n: h for n, h in zip(self.names, self.handles) if n not in dead}
        killed = time.time()
        manifest = self._launch_surviving(self._latest_manifest(), recovering=True, survivors=survivors)
        m = self._launch_marks
        steps = {"confirm": entered - detected, "probe": probed - entered, "kill": killed - probed, "read_manifest": m[0] - killed}
        steps.update(zip(("reset", "connect", "start"), (b - a for a, b in zip(m, m[1:]))))
        sinks = [self.actors[k] for k in self.actors if any(self.plan.steps[sid].kind == "sink" for sid in self.plan.stages[k.stage].step_ids)]
        snapshot_id = None if manifest is None else manifest.snapshot_id
        recovery = Recovery(detected, time.time() - detected, snapshot_id, pending=[a.first_release.remote() for a in sinks], steps_s=steps,
                            resets_s=self._resets)
        self.status.recoveries.append(recovery)
        self._replenish_at = time.time() + STANDBY_REPLENISH_DELAY_S
        self._inject("after_restore")

    def _placement(self):
        """Scheduling strategies for new actors, one per call of ``next``: away from the nodes
        that lost actors in this recovery, round-robin over the others; Ray's SPREAD when no
        node is to be avoided or none is left. A
        node that vanished stays alive in Ray's view until its health check fails (~14 s):
        without this, replacements could be placed there and die with it again."""
        others = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in self.avoid_nodes] if self.avoid_nodes else []
        if not others:
            while True:
                yield "SPREAD"
        while True:
            for node in others:
                # Hard: with soft, Ray may still spill an actor back to the lost node it takes for alive.
                yield NodeAffinitySchedulingStrategy(node_id=node, soft=False)

    def _drop_standbys_on(self, nodes: set) -> None:
        """Kill the standbys known to run on ``nodes`` (lost ones) or known dead; keep the rest
        (one whose node is not known yet is still starting)."""
        kept = []
        for handle, name, node in self.standbys:
            try:
                lost = bool(ray.wait([node], timeout=0)[0]) and ray.get(node) in nodes
            except ray.exceptions.RayActorError:
                lost = True
            if lost:
                kill_actors([handle], [])
            else:
                kept.append((handle, name, node))
        self.standbys = kept

    def _lost(self, alive: list) -> set:
        """The actors that died, from the ``alive()`` calls that answered: a call fails when its
        actor died, and returns the peers its actor saw die (their connections ended)."""
        lost = set()
        for name, ref in zip(self.names, alive):
            if ray.wait([ref], timeout=0)[0]:
                try:
                    lost.update(n for n in ray.get(ref) if n in self.names)
                except ray.exceptions.RayActorError:
                    lost.add(name)
        return lost

    def _replenish(self) -> None:
        """Start standbys up to ``config.standbys``: processes that take a lost instance's place."""
        while len(self.standbys) < self.config.standbys:
            name = f"{self.plan.flow_name}/standby/{self._standbys_started}"
            self._standbys_started += 1
            handle = StageActor.options(name=name, namespace=NAMESPACE, scheduling_strategy="SPREAD").remote(self.plan, None, None, None, b"")
            self.standbys.append((handle, name, handle.node.remote()))

    def _kill(self, handles: list, names: list) -> None:
        """Kill ``handles``; the actors of ``names`` will be replaced by new ones: a name Ray
        still holds after NAME_WAIT_S (its node vanished) is taken as ``<name>#<n>`` instead."""
        taken = kill_actors(handles, self._actor_names(names), wait_s=NAME_WAIT_S)
        self._renames += 1
        self.renamed = {n: f"{n}#{self._renames}" for n in names if self.real_names.get(n, n) in taken}

    def _actor_names(self, names) -> list:
        """The names of the actors playing the instances ``names`` (a standby keeps its own)."""
        return [self.real_names.get(n, n) for n in names]

    def _inject(self, moment: str) -> None:
        names = self.faults.get(moment)
        if names:
            name = names.pop(0)
            handle = dict(zip(self.names, self.handles)).get(name) or ray.get_actor(name, namespace=NAMESPACE)
            ray.kill(handle, no_restart=True)

    def resolve_recoveries(self) -> None:
        """Fill in first_output_s of recoveries whose first output has been released."""
        for r in list(self.status.recoveries):
            pending = r.pending  # status() may resolve it on another thread meanwhile
            if pending:
                ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
                times = []
                for ref in ready:
                    try:
                        times.append(ray.get(ref))
                    except ray.exceptions.RayActorError:
                        pass
                if times:
                    r.first_output_s = min(times) - r.detected_at
                    r.pending = None

    def live_status(self, latency_since: Optional[float] = None, latency_samples: bool = False) -> dict:
        """Watermark, progress and dead letters now, plus snapshot and recovery history.

        ``latency_ms``: release latency of the elements released since ``latency_since``
        (default: the last LATENCY_WINDOW_S seconds; see :mod:`.live_figures`);
        ``latency_samples`` adds the window's values (``"latency_samples_ms"``).
        Asked during a recovery, actors that are dead and not replaced yet are left out of
        the sums and counted in ``"unavailable"`` (the acker's figures are then None)."""
        now = time.time()
        since = now - LATENCY_WINDOW_S if latency_since is None else latency_since
        actors = self.actors  # a recovery replaces the dict, never fills it: one set of actors for both rounds
        # Sinks' counts are read in a round before the sources': the actors answer at different
        # moments, and in one round a sink could report elements a source emitted after it had
        # answered (released > emitted in a one-to-one flow). The sinks' release samples come
        # in the first round, the emit samples of those times in the second.
        first = self._ask([self.acker.status.remote(), *(a.stats.remote(since) for a in actors.values())])
        stats = [s for s in first[1:] if s is not None]
        times = sorted({t for s in stats for t, _ in s["releases"]}) or None
        second = self._ask([a.stats.remote(None, times if self._stamps_emits(k) else None) for k, a in actors.items()])
        acker = first[0] or {"watermark": None, "in_flight": None}
        sources = [s for s in second if s is not None]
        last = self.status.snapshots[-1] if self.status.snapshots else None
        self.resolve_recoveries()
        step_dead_letters = sum_per_step(s["step_dead_letters"] for s in stats)
        elements, tombstones = sum_per_step(s["elements"] for s in stats), sum_per_step(s["tombstones"] for s in stats)
        latencies = latencies_ms((s["releases"] for s in stats), (s["emits"] for s in sources))
        extra = {"latency_samples_ms": latencies} if latency_samples else {}
        return {
            **extra,
            "steps": {s.name: {"elements": elements.get(s.name, 0), "tombstones": tombstones.get(s.name, 0)} for s in self.plan.steps},
            "latency_ms": window_summary(latencies),
            "watermark_lag_s": watermark_lag_s(acker["watermark"], self.plan, now),
            "unavailable": max(first.count(None), second.count(None)),
            "watermark": acker["watermark"],
            "in_flight": acker["in_flight"],
            "emitted": sum(s["emitted"] for s in sources),
            "released": sum(s["released"] for s in stats),
            "dead_letters": sum(s["dead_letters"] for s in sources) + sum(step_dead_letters.values()),
            "step_dead_letters": step_dead_letters,
            "source_lag": _sum_known(s["source_lag"] for s in sources),
            "source_partitions": [part for s in sources for part in s["source_partitions"]],
            "source_behind": [part["behind"] for s in sources for part in s["source_partitions"] if part.get("behind")],
            "skipped": self.status.skipped,
            "state_cache": functools.reduce(add_cache_stats, (s["state_cache"] for s in stats), {}),
            "late_elements": sum_per_step(s["late_elements"] for s in stats),
            "last_snapshot": None if last is None else {
                "id": last.snapshot_id, "t": last.t, "duration_s": last.duration_s, "age_s": round(time.time() - last.committed_at, 3)},
            "snapshots": self.status.committed,
            "snapshot_failures": self.status.snapshot_failures,
            "last_snapshot_error": self.status.last_snapshot_error,
            # seconds snapshots have failed in a row (0: the last one was committed)
            "snapshots_failing_s": 0.0 if self.status.failing_since is None else round(time.time() - self.status.failing_since, 3),
            "recoveries": [
                {"detected_at": r.detected_at, "restored_s": r.restored_s, "first_output_s": r.first_output_s, "snapshot": r.snapshot_id,
                 "steps_s": dict(r.steps_s), "resets_s": dict(r.resets_s)}
                for r in self.status.recoveries
            ],
            "commit_groups": {self.plan.stages[stage].name: hook.status() for stage, hook in self.commit_hooks.items()},
        }

    def _stamps_emits(self, instance: tuple) -> bool:
        """Whether ``instance`` notes emit samples: it reads a source or closes windows."""
        stage = self.plan.stages[instance[0]]
        return stage.source_id >= 0 or any(self.plan.steps[sid].kind in TIMED_KINDS for sid in stage.step_ids)

    @staticmethod
    def _ask(refs: list) -> list:
        """Each answer, or None for an actor that is dead or does not answer within 10 s."""
        answers = []
        for ref in refs:
            try:
                answers.append(ray.get(ref, timeout=10))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                answers.append(None)
        return answers

    def shutdown(self) -> None:
        kill_actors(self.handles + [s[0] for s in self.standbys], self._actor_names(self.names) + [s[1] for s in self.standbys])
        self.standbys = []
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None
        for hook in self.commit_hooks.values():
            hook.close(timeout_s=COMMIT_HOOK_CLOSE_S)


def settle_answers(refs: list, answered: int, deadline: float, quiet: float = CONFIRM_QUIET_S) -> int:
    """Wait while more of ``refs`` keep answering: until none has for ``quiet`` seconds, all
    have, or ``deadline`` (wall time) passes. ``answered``: how many had when called.
    Returns how many have."""
    while 0 < answered < len(refs):
        left = deadline - time.time()
        if left <= 0:
            break
        ready, _ = ray.wait(refs, num_returns=answered + 1, timeout=min(quiet, left))
        if len(ready) <= answered:
            break
        answered = len(ready)
    return answered


def _sum_known(values) -> Optional[int]:
    """Sum of the values that are not None; None if all are."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _unreachable_nodes(nodes: set, timeout: float = 0.5) -> set:
    """The nodes among ``nodes`` whose raylet does not accept a TCP connection within
    ``timeout`` (refused at once when its process died; a timeout when its machine is gone)."""
    gone = set()
    for info in ray.nodes():
        if info["NodeID"] in nodes and info.get("Alive"):
            try:
                socket.create_connection((info["NodeManagerAddress"], info["NodeManagerPort"]), timeout=timeout).close()
            except OSError:
                gone.add(info["NodeID"])
        elif info["NodeID"] in nodes:
            gone.add(info["NodeID"])
    return gone
