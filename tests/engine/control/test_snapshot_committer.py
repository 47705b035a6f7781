"""SnapshotCommitter without Ray: manifests committed to a real local store, the record of
committed and failed snapshots, the backoff after failures and the failure timeout, and
the schedule's items read from a real snapshot inbox."""

from __future__ import annotations

import time

import pytest

from driftstream.engine import Flow
from driftstream.engine.control.failover import Hung
from driftstream.engine.control.snapshot_committer import SnapshotCommitter
from driftstream.engine.control.snapshot_log import KEEP_SNAPSHOT_RECORDS, SNAPSHOT_RETRY_MAX_S, SnapshotLog, SnapshotRecord
from driftstream.engine.control.snapshot_stream import SnapshotInbox, SnapshotStream
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.manifest import SnapshotFailed, SnapshotPart
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.protocol import ScheduleEnded, SnapshotTaken
from driftstream.engine.testing import MemorySink, MemorySource

def plan():
    """A two-stage plan (a source, then a keyed count) at parallelism 2."""
    flow = Flow("committed")
    flow.source(MemorySource(["a", "b"])).key_by(str).count().sink(MemorySink("out"))
    return flow.plan(2)


def committer(tmp_path, **options) -> SnapshotCommitter:
    config = RunConfig(guarantee="exactly-once", snapshot_dir=str(tmp_path), snapshot_interval=0.5, **options)
    return SnapshotCommitter(plan(), config)


def item(sid: int, errors: bool = False, missing: tuple = ()) -> tuple:
    """A snapshot as the acker sends it: ``(id, T, parts, missing, started, took_s)``."""
    part = SnapshotPart(sources={"0": [sid, sid]}, error="disk full" if errors else None)
    return sid, (sid, 0, 0, sid), {Instance(0, 0): part, Instance(0, 1): SnapshotPart()}, list(missing), 100.0 + sid, 0.01


class FailingStore:
    """The store an outage leaves: every manifest write fails."""

    def write_manifest(self, sid: int, manifest: dict) -> None:
        raise OSError("store unreachable")


def test_a_commit_writes_the_manifest_and_records_it(tmp_path):
    c = committer(tmp_path)
    record = c.commit(item(3))
    assert (record.snapshot_id, record.t, record.duration_s, record.requested_at) == (3, (3, 0, 0, 3), 0.01, 103.0)
    assert c.latest_manifest().snapshot_id == 3 and c.latest_manifest().part(Instance(0, 0)).positions() == {0: (3, 3)}
    assert (c.log.committed, list(c.log.records)) == (1, [record])


def test_the_fault_hook_runs_before_the_manifest_is_written(tmp_path):
    c = committer(tmp_path)
    seen = []
    c.before_commit = lambda: seen.append(c.latest_manifest())
    c.commit(item(1))
    c.commit(item(2))
    assert [m and m.snapshot_id for m in seen] == [None, 1]


def test_commit_hooks_are_told_the_offsets_of_their_source_stage(tmp_path):
    class Hook:
        submitted: list = []

        def submit(self, offsets: dict) -> None:
            self.submitted.append(offsets)

    c = committer(tmp_path)
    c.commit_hooks = {0: Hook()}
    c.commit(item(4))
    assert Hook.submitted == [{0: 4}]


def test_missing_parts_name_the_hung_actors(tmp_path):
    c = committer(tmp_path)
    with pytest.raises(Hung) as exc:
        c.commit(item(1, missing=[(0, 1)]))
    assert exc.value.names == {c.plan.actor_name(Instance(0, 1))}
    assert c.log.committed == 0 and c.latest_manifest() is None


def test_failures_are_counted_backed_off_and_end_the_run_past_the_timeout(tmp_path):
    c = committer(tmp_path, snapshot_failure_timeout=60.0)
    assert c.commit_or_defer(item(1))
    assert not c.commit_or_defer(item(2, errors=True))  # a part could not be written
    c.store = FailingStore()
    assert not c.commit_or_defer(item(3))
    log = c.log
    assert (log.committed, log.failures, log.failures_in_row) == (1, 2, 2)
    assert log.last_error == "OSError: store unreachable"
    log.failing_since -= 61  # failing for a minute and more
    with pytest.raises(SnapshotFailed, match=r"failed for 61 s .* the last committed snapshot: snapshot 1\. "):
        c.commit_or_defer(item(4))


def test_the_backoff_doubles_per_failure_in_a_row_up_to_its_cap():
    log = SnapshotLog()
    waits = []
    for _ in range(7):
        log.fail("OSError", now=0.0)
        waits.append(log.retry_at(interval=0.5, now=10.0) - 10.0)
    assert waits == [0.5, 1.0, 2.0, 4.0, SNAPSHOT_RETRY_MAX_S, SNAPSHOT_RETRY_MAX_S, SNAPSHOT_RETRY_MAX_S]
    log.add(SnapshotRecord(1, (1,), 0.01))
    assert log.failing_s(now=20.0) == 0.0 and log.failures == 7


def test_the_log_keeps_the_last_records_and_counts_them_all():
    log = SnapshotLog()
    for sid in range(KEEP_SNAPSHOT_RECORDS + 5):
        log.add(SnapshotRecord(sid, (sid,), 0.01))
    assert log.committed == KEEP_SNAPSHOT_RECORDS + 5
    assert (len(log.records), log.records[0].snapshot_id) == (KEEP_SNAPSHOT_RECORDS, 5)


def test_a_resumed_run_goes_on_past_every_snapshot(tmp_path):
    c = committer(tmp_path)
    c.commit(item(2))
    c.commit(item(5))
    resumed = committer(tmp_path, resume=True)
    assert resumed.latest_manifest().snapshot_id == 5  # a new committer keeps what it finds
    resumed.past_existing()
    assert resumed.next_snapshot_id == 6
    assert resumed.take_id() == 6 and resumed.next_snapshot_id == 7


def test_under_sampled_votes_a_certified_id_is_one_the_votes_take(tmp_path):
    """A rescale's drained snapshot and its reassigned manifest (rescaler.py) take ids N samples,
    so a vote certifies them and the store keeps them; other ids go on one by one."""
    c = committer(tmp_path, recovery="local", replicas=2, verify="sample:3")
    c.commit(item(4))
    assert c.take_id() == 5  # past the store's ids, as any
    assert c.take_id(certified=True) == 6 and c.take_id(certified=True) == 9 and c.take_id() == 10
    first = committer(tmp_path / "first", recovery="local", replicas=2)
    assert first.take_id(certified=True) == 1  # nothing to skip: no vote samples


def test_without_snapshots_there_is_no_store_and_no_schedule():
    c = SnapshotCommitter(plan(), RunConfig(guarantee="none"))
    c.schedule()
    assert (c.takes_snapshots, c.snapshot_dir, c.latest_manifest(), c.wait()) == (False, None, None, 0.2)
    c.start_when_due(acker=None)
    c.final_snapshot(acker=None)
    assert c.stream is None


@pytest.fixture
def inbox():
    inbox = SnapshotInbox("127.0.0.1")
    yield inbox
    inbox.close()


def test_the_schedule_commits_what_arrives_and_ends_with_the_run(tmp_path, inbox):
    c = committer(tmp_path)
    c.schedule()
    assert 0.0 < c.wait() <= 0.2  # the first schedule starts one interval from now
    c.stream = SnapshotStream(inbox, number=1, first_id=1, patience=10.0)
    c.commit_arrived(acker=None)  # nothing yet
    inbox.queue.put(SnapshotTaken(1, item(1)))
    assert c.wait() == 0.0
    c.commit_arrived(acker=None)
    assert c.log.committed == 1 and c.stream is not None
    inbox.queue.put(ScheduleEnded(1))
    c.commit_arrived(acker=None)
    assert (c.stream, c.next_at, c.next_snapshot_id) == (None, float("inf"), 3)  # ids past any it may have begun


def test_an_overdue_schedule_means_the_acker_hangs(tmp_path, inbox):
    c = committer(tmp_path)
    c.stream = SnapshotStream(inbox, number=1, first_id=1, patience=0.0)
    time.sleep(0.01)
    with pytest.raises(Hung) as exc:
        c.commit_arrived(acker=None)
    assert exc.value.names == {"committed/acker"}
    c.abandon()
    assert c.stream is None and c.next_snapshot_id == 2
