"""Taking a run's snapshots and committing their manifests, on the driver side.

Snapshots are acker-based and asynchronous: the committer asks the acker to
attach ``snapshot(id)`` to the current watermark T; every stage instance
stores its keyed state (everything below T: a delta or a base checkpoint),
notes where its source partitions replay from, all in the background, and sends
its part (``prepared``) to the acker on the data plane; the acker answers with
every part, and the manifest is written atomically. One call to the acker takes
every snapshot of a schedule and sends each as it completes, a data-plane message
(:mod:`.snapshot_stream`); the supervisor goes on watching the actors meanwhile.
Output never waits for any of it.

A snapshot the store fails is counted (:class:`~.snapshot_log.SnapshotLog`); its schedule
ends and another starts after a backoff. The run stops only past ``snapshot_failure_timeout``.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Callable, Optional

import ray

from driftstream.ordering.epoch_votes import sampled
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import RunConfig, vote_sample
from driftstream.engine.model.manifest import Manifest, MissingParts, SnapshotFailed, committed_t, manifest_of
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.private_dir import data_dir
from driftstream.engine.control.failover import Hung
from driftstream.engine.control.launcher import acker_name_of
from driftstream.engine.control.snapshot_log import SnapshotLog, SnapshotRecord
from driftstream.engine.control.snapshot_stream import SnapshotInbox, SnapshotStream
from driftstream.engine.runtime.output_logs import trim_logs

#: While a snapshot schedule runs, the watch loop waits for the next snapshot this long
#: at most before it looks at the actors again: a death is seen within it.
POLL_S = 0.05

#: Seconds a source's commit hook (a Kafka consumer group commit) may take to finish at shutdown.
COMMIT_HOOK_CLOSE_S = 5.0


def default_snapshot_dir(flow_name: str) -> str:
    """Where snapshots go when no snapshot_dir is given: a local directory per flow, in this
    user's data directory (mode 0700, see :mod:`driftstream.engine.model.private_dir`)."""
    return str(data_dir() / "snapshots" / flow_name)


class SnapshotCommitter:
    """Takes ``plan``'s snapshots through its acker and commits them to the store; without
    snapshots (``guarantee='none'``) ``store`` is None and every method does nothing.

    The watch loop drives the schedule: :meth:`schedule` when it starts watching,
    :meth:`wait` and :meth:`commit_arrived` at every turn, :meth:`start_when_due` to begin
    the next schedule, :meth:`abandon` when it stops watching. ``plan`` is the plan whose
    actors are snapshotted (its parallelism goes into each manifest); ``before_commit``
    is called before each manifest is written (tests inject faults there).
    """

    def __init__(self, plan: Plan, config: RunConfig, before_commit: Callable[[], None] = lambda: None) -> None:
        self.plan = plan
        self.config = config
        self.before_commit = before_commit
        #: recovery="local": hears each committed manifest (the instances trim their upstream logs; None: nothing)
        self.after_commit: Optional[Callable[[Manifest], None]] = None
        self.store: Optional[SnapshotStore] = None
        self.snapshot_dir: Optional[str] = None
        #: N of verify="sample:N" with replicas (the votes certify the snapshots whose ids it samples), else None
        self.sample = vote_sample(config.verify) if config.replica_count > 1 else None
        if config.takes_snapshots:
            self.snapshot_dir = config.snapshot_dir or default_snapshot_dir(plan.flow_name)
            # Pruning lists the store: about once a second, whatever the snapshot interval.
            # verify="sample:N": the newest snapshot a vote certified is kept, a vote's rollback restores it
            pinned = None if self.sample is None else functools.partial(sampled, every=self.sample)
            self.store = SnapshotStore(self.snapshot_dir, prune_every=max(1, round(1.0 / config.snapshot_interval)), pinned=pinned)
        self.log = SnapshotLog()  # committed and failed snapshots
        #: the manifest the running incarnation was restored from (None: the beginning); the
        #: supervisor sets it at each launch (see committed_t)
        self.restored: Optional[Manifest] = None
        self.next_snapshot_id = 1
        self.inbox: Optional[SnapshotInbox] = None  # where the acker sends snapshots, once a schedule started
        self.streams = 0  # schedules started: each stream's number
        self.stream: Optional[SnapshotStream] = None  # the schedule running while the loop watches
        self.next_at = float("inf")  # when the next schedule starts
        #: source stage -> what its source wants told of each committed snapshot (a Kafka consumer group)
        self.commit_hooks: dict = {}
        if self.store is not None:
            for stage in plan.stages:
                hook = plan.steps[stage.source_id].source.commit_hook() if stage.source_id >= 0 else None
                if hook is not None:
                    self.commit_hooks[stage.index] = hook

    @property
    def takes_snapshots(self) -> bool:
        return self.store is not None

    def latest_manifest(self) -> Optional[Manifest]:
        """The newest committed manifest in the store, if any."""
        data = self.store.read_latest_manifest() if self.store is not None else None
        return None if data is None else Manifest.from_json(data)

    def take_id(self, certified: bool = False) -> int:
        """A snapshot id past every snapshot directory, committed or not (a new snapshot never
        shares one with files an earlier run left behind), for a manifest committed without
        the acker (a reassigned one); later snapshots come after it. ``certified``: one the
        votes certify under sample:N (see :meth:`snapshot`)."""
        if self.store is not None:
            self.next_snapshot_id = max([self.next_snapshot_id - 1, *self.store.snapshot_ids()]) + 1
        if certified:
            self._skip_to_sampled()
        sid, self.next_snapshot_id = self.next_snapshot_id, self.next_snapshot_id + 1
        return sid

    def _skip_to_sampled(self) -> None:
        """Under verify="sample:N": the next id a multiple of N (the ids between go unused)."""
        if self.sample is not None:
            self.next_snapshot_id = -(-self.next_snapshot_id // self.sample) * self.sample

    def past_existing(self) -> None:
        """Go on past the snapshots in the store (a resumed run's first snapshot follows them)."""
        if self.store is not None:
            self.next_snapshot_id = max([self.next_snapshot_id - 1, *self.store.snapshot_ids()]) + 1

    # -- the schedule, driven by the watch loop ------------------------------------------

    def schedule(self) -> None:
        """Start the next schedule one snapshot interval from now."""
        self.stream, self.next_at = None, time.time() + self.config.snapshot_interval

    def wait(self) -> float:
        """Block for the running schedule's next snapshot, POLL_S at most; then how long the
        loop may wait for actors (snapshots arrive on the data plane, not as Ray refs)."""
        if self.stream is not None:
            self.stream.wait(POLL_S)
            return 0.0
        return 0.2 if self.store is None else min(0.2, max(0.0, self.next_at - time.time()))

    def commit_arrived(self, acker) -> None:
        """Commit the snapshot that arrived, if one did. Raises Hung if the acker's is overdue."""
        stream = self.stream
        if stream is None:
            return
        if not stream.wait(0):
            self.check_on_time(stream)
            return
        item = stream.take()
        if item is None:  # the run is complete: the acker's end follows
            self._drop(stream)
            self.stream, self.next_at = None, float("inf")
        elif not self.commit_or_defer(item):
            # The store failed: end the schedule, start another after a backoff.
            self._drain(acker, stream, tolerant=True)
            self.stream, self.next_at = None, self.log.retry_at(self.config.snapshot_interval, time.time())

    def start_when_due(self, acker) -> None:
        """Start the acker's schedule of snapshots if none runs and it is time."""
        if self.store is not None and self.stream is None and time.time() >= self.next_at:
            self.stream = self._start(acker, count=None)

    def finish_schedule(self, acker) -> None:
        """End the running schedule and commit what it still yields."""
        if self.store is not None:
            self._drain(acker, self.stream)
            self.stream = None

    def final_snapshot(self, acker) -> None:
        """At a stop: commit what the schedule still yields, then one last snapshot (a resume
        starts from it)."""
        if self.store is not None:
            self.finish_schedule(acker)
            self.snapshot(acker)

    def abandon(self) -> None:
        """Forget the running schedule (the loop stops watching)."""
        if self.stream is not None:
            self._drop(self.stream)
            self.stream = None

    # -- snapshots and their commits -----------------------------------------------------

    def snapshot(self, acker, certified: bool = False) -> Optional[SnapshotRecord]:
        """Take one snapshot and commit its manifest; None if the run is already complete.

        ``certified`` (a rescale's drained snapshot, which every replica restores at the new
        parallelism): under verify="sample:N" its id is one N samples, so the epoch that ends at
        it is voted, its primaries' parts wait for the vote, and the store keeps it as certified.
        An unsampled one would carry a corrupt primary's state unchecked into every replica, and
        a later vote's rollback would go past it, to a snapshot at the old parallelism."""
        if certified:
            self._skip_to_sampled()
        stream = self._start(acker, count=1)
        try:
            item = self._take(stream)
        finally:
            self._drop(stream)
        return None if item is None else self.commit(item)

    def _start(self, acker, count: Optional[int]) -> SnapshotStream:
        """Start the acker's schedule of ``count`` snapshots (None: until the run completes)."""
        if self.inbox is None:
            self.inbox = SnapshotInbox(ray.util.get_node_ip_address(), self.config.data_plane_tls, self.config.data_plane_key)
        self.streams += 1
        # An item later than this means the acker hangs, as a single call's bound did.
        interval = self.config.snapshot_interval
        timeout = self.config.snapshot_timeout
        stream = SnapshotStream(self.inbox, self.streams, self.next_snapshot_id, patience=interval + timeout + 5)
        inbox = (self.inbox.address, self.inbox.key, stream.number)
        stream.call = acker.snapshots.remote(self.next_snapshot_id, count, interval, timeout, inbox)
        return stream

    def _take(self, stream: SnapshotStream) -> Optional[tuple]:
        """Block for ``stream``'s next snapshot (None: it ended). Hung past its deadline;
        RayActorError if the acker died (its schedule call fails)."""
        while not stream.wait(POLL_S):
            if ray.wait([stream.call], timeout=0)[0]:
                ray.get(stream.call)  # raises if the acker died; else its end is on the way
            self.check_on_time(stream)
        return stream.take()

    def check_on_time(self, stream: SnapshotStream) -> None:
        """Hung (the acker) when ``stream``'s next snapshot is overdue: the acker answers
        pings, but its schedule went silent (e.g. its link to the inbox is gone)."""
        if stream.overdue():
            raise Hung({acker_name_of(self.plan)})

    def _drop(self, stream: SnapshotStream) -> None:
        """Forget ``stream``: later snapshots take ids past any it may have begun."""
        self.next_snapshot_id = max(self.next_snapshot_id, stream.next_id + 1)

    def _drain(self, acker, stream: Optional[SnapshotStream], tolerant: bool = False) -> None:
        """End ``stream``'s schedule and commit what it still yields (a stop); ``tolerant``:
        a snapshot the store fails is counted, not raised."""
        if stream is None:
            return
        ray.get(acker.end_snapshots.remote())
        while (item := self._take(stream)) is not None:
            if tolerant:
                self.commit_or_defer(item)
            else:
                self.commit(item)
        self._drop(stream)

    def commit_or_defer(self, item: tuple) -> bool:
        """Commit ``item``; False if the store failed it (a part or the manifest could not be
        written). Processing and output go on meanwhile; past ``snapshot_failure_timeout``
        seconds of failures in a row, SnapshotFailed stops the run, since a recovery would
        replay everything since the last committed snapshot."""
        try:
            self.commit(item)
            return True
        except (SnapshotFailed, OSError) as exc:
            log, limit = self.log, self.config.snapshot_failure_timeout
            failing_s = log.fail(f"{type(exc).__name__}: {exc}", time.time())
            if failing_s > limit:
                last = f"snapshot {log.records[-1].snapshot_id}" if log.records else "none"
                raise SnapshotFailed(
                    f"snapshots have failed for {failing_s:.0f} s (snapshot_failure_timeout="
                    f"{limit:g}), the last with {log.last_error}; the last committed "
                    f"snapshot: {last}. The run stops so that a recovery never replays more than that: "
                    "make the snapshot store writable, then start the flow again with resume=True") from exc
            return False

    def commit(self, item: tuple) -> SnapshotRecord:
        """Commit the manifest of one snapshot from the acker, ``(id, T, parts, missing,
        started, took_s)``. Raises Hung for actors that did not answer, SnapshotFailed for a
        part that could not be written."""
        sid, t, parts, missing, started, took_s = item
        plan = self.plan
        try:
            manifest = manifest_of(plan, sid, committed_t(t, self.restored), parts, missing, self.restored)
        except MissingParts as exc:
            raise Hung({plan.actor_name(i) for i in exc.instances}) from None
        self.before_commit()
        self.store.write_manifest(sid, manifest.to_json())
        if plan.logged_steps:  # the output logs' segments no committed snapshot replays
            try:
                trim_logs(self.store)
            except OSError:
                pass  # trimmed at a later commit
        for stage, hook in self.commit_hooks.items():
            hook.submit(manifest.offsets(Instance(stage, i) for i in range(plan.stages[stage].parallelism)))
        record = SnapshotRecord(sid, t, took_s, started, time.time())
        self.log.add(record)
        if self.after_commit is not None:
            self.after_commit(manifest)
        return record

    def close(self) -> None:
        """Stop the inbox; let the commit hooks finish what is pending."""
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None
        for hook in self.commit_hooks.values():
            hook.close(timeout_s=COMMIT_HOOK_CLOSE_S)
