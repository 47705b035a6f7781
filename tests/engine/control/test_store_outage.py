"""The snapshot store unwritable for a while: processing and output go on, snapshots fail and
are retried with backoff, status() shows how far the last committed one lags, and once the
store is back a kill recovers from a new snapshot with the output of a run without any of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import PacedSource, wait_for_actor
from tests.reference import reference_outputs
from tests.status_wait import wait_for_status


def _count(n, x):
    n = (n or 0) + 1
    return n, [x[0], x[1], n]


def build(items: list, sink, name: str) -> Flow:
    flow = Flow(name)
    (flow.source(PacedSource(items, 800, partitions=2), name="events").key_by(lambda x: x[0], name="key")
         .stateful_map(_count, name="count").sink(sink))
    return flow


@contextlib.contextmanager
def unwritable(directory: Path):
    """``directory`` unwritable for the duration, even for root: immutable (chattr +i; no entry
    can be made in it), or where that is not supported, moved aside with a file in its place."""
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        return
    aside = directory.with_name(directory.name + ".aside")
    os.rename(directory, aside)
    directory.write_text("the store is down")
    try:
        yield
    finally:
        directory.unlink()
        os.rename(aside, directory)


def test_a_store_outage_then_a_kill_gives_the_output_of_a_run_without_either(ray_session, tmp_path):
    import ray

    if shutil.which("chattr") is None and os.geteuid() != 0:
        pytest.skip("needs chattr or root to make the store unwritable")
    items = [("abcdefg"[i % 7], i) for i in range(12_000)]  # 15 s at 800/s
    expected = reference_outputs(build(items, _memory_sink(), "outage"))["out"]
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    flow = build(items, FileSink(tmp_path / "out", name="out"), "outage")
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(snaps))
    try:
        wait_for_status(lambda s: s["snapshots"] >= 2, handle, "snapshots before the outage")
        with unwritable(snaps):
            before = handle.status()
            # the store fails every snapshot while output keeps flowing
            during = wait_for_status(lambda s: s["snapshots_failing_s"] >= 3.0 and s["snapshot_failures"] >= 2, handle, "failing snapshots")
            assert during["snapshots"] == before["snapshots"] and during["last_snapshot"]["age_s"] >= 3.0
            assert during["released"] > before["released"], "output must not wait for the store"
            assert "Error" in during["last_snapshot_error"]
        # back: a snapshot is committed again (after the backoff), then a stateful actor dies
        after = wait_for_status(lambda s: s["snapshots"] > during["snapshots"], handle, "a snapshot after the outage", timeout=30)
        assert after["snapshots_failing_s"] == 0.0 and after["last_snapshot"]["age_s"] < 10
        ray.kill(wait_for_actor("outage/key/1", timeout=30), no_restart=True)
        result = handle.wait(timeout=120)
    finally:
        handle.stop(timeout=60)
    assert result.metrics.recoveries == 1 and result.metrics.snapshot_failures >= 2
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == expected


def test_a_store_down_longer_than_snapshot_failure_timeout_stops_the_run_with_what_to_do(ray_session, tmp_path):
    from driftstream.engine.model.manifest import SnapshotFailed

    items = [("abc"[i % 3], i) for i in range(40_000)]  # 50 s at 800/s: the store stays down past the timeout
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    flow = build(items, FileSink(tmp_path / "out", name="out"), "outage-stop")
    handle = flow.start(parallelism=1, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(snaps),
                        snapshot_failure_timeout=2.0)
    try:
        wait_for_status(lambda s: s["snapshots"] >= 1, handle, "a snapshot before the outage")
        with unwritable(snaps):
            with pytest.raises(SnapshotFailed, match=r"snapshots have failed for \d+ s .*resume=True"):
                handle.wait(timeout=60)
    finally:
        with contextlib.suppress(SnapshotFailed):  # the run's error, again
            handle.stop(timeout=60)


def _memory_sink():
    from driftstream.engine.testing import MemorySink

    return MemorySink("out")


def test_snapshot_failure_timeout_is_a_positive_number_of_seconds():
    assert RunConfig(snapshot_failure_timeout=30).snapshot_failure_timeout == 30
    with pytest.raises(FlowError, match="snapshot_failure_timeout is a positive number of seconds"):
        RunConfig(snapshot_failure_timeout=0)
