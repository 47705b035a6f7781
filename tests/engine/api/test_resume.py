"""A driver killed with SIGKILL mid-stream; a new driver resumes from snapshot_dir and finishes,
with exactly the output of a failure-free run. Also start() / status() / stop() / resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from driftstream.engine.connectors.file_sink import read_file_sink
from driftstream.engine.model.config import COORDINATOR_NICENESS
from driftstream.snapshots.store import SnapshotStore

from tests.engine.api import resume_flow
from tests.engine.api.resume_flow import N, build, failure_free_output

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[3]


def test_driver_killed_with_sigkill_then_resumed(ray_session, tmp_path, tmp_path_factory):
    expected = failure_free_output(tmp_path_factory)
    out, snaps = tmp_path / "out", tmp_path / "snaps"

    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.api.resume_flow", address, str(out), str(snaps)], cwd=ROOT, start_new_session=True
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out.exists() and len(read_file_sink(out, "out")) > N // 3):
            assert driver.poll() is None, "the driver ended before it could be killed"
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    before = len(read_file_sink(out, "out"))
    assert 0 < before < N

    # The resume paced at 8,000/s: the pace only spaces the reads (an element's time is its
    # index), so the rest of the input need not take the killed run's 2,000/s.
    result = resume_flow.build(str(out), rate=8000).run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3,
                                                         snapshot_dir=str(snaps), resume=True)
    got = read_file_sink(out, "out")
    assert got == expected  # nothing lost, nothing twice, same order and Metas
    assert result.metrics.elements["numbers"] < N  # the source resumed from a snapshot rather than from the start


@ray.remote(num_cpus=0)
def _niceness() -> int:
    return os.nice(0)


def test_start_status_stop_then_resume(ray_session, tmp_path, tmp_path_factory):
    expected = failure_free_output(tmp_path_factory)
    out, snaps = tmp_path / "out", tmp_path / "snaps"
    flow = build(str(out))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(snaps))
    deadline = time.time() + 120
    while not (out.exists() and len(read_file_sink(out, "out")) >= N // 4):
        assert time.time() < deadline, f"a quarter of the output did not come within 120 s: {handle.status()}"
        time.sleep(0.05)
    status = handle.status()
    assert status["running"] and status["released"] > 0 and status["emitted"] >= status["released"]
    assert status["watermark"] > (0,) and status["dead_letters"] == 0
    # The coordinator's housekeeping runs below the stage actors' priority (Ray starts every worker
    # at its own worker niceness, 15 by default; the coordinator goes further, up to Linux's 19).
    worker_niceness = ray.get(_niceness.remote())
    assert status["coordinator_niceness"] == min(19, worker_niceness + COORDINATOR_NICENESS)
    stopped = handle.stop(timeout=60)
    assert stopped.metrics.snapshots >= 1
    # The stop ended the running snapshot stream and then took a final snapshot, at or past
    # the watermark seen before the stop: the resume starts from there.
    assert tuple(SnapshotStore(str(snaps)).read_latest_manifest()["t"]) >= status["watermark"]
    assert handle.status()["running"] is False

    # The same flow, its reads paced at 8,000/s (an element's time is its index, not its pace)
    resumed = resume_flow.build(str(out), rate=8000).start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                                            snapshot_dir=str(snaps), resume=True)
    resumed.wait(timeout=120)
    assert read_file_sink(out, "out") == expected


def test_detached_flow_survives_its_coordinator_process(ray_session, tmp_path, tmp_path_factory):
    """A detached flow's coordinator dies (its process killed): Ray restarts it, the new
    incarnation resumes from the newest snapshot, and the output is a failure-free run's."""
    from driftstream.engine import attach, list_flows

    expected = failure_free_output(tmp_path_factory)
    out, snaps = tmp_path / "out", tmp_path / "snaps"
    handle = build(str(out)).start(parallelism=2, detached=True, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(snaps))
    assert [f["state"] for f in list_flows() if f["name"] == "resume"] == ["running"]
    deadline = time.time() + 120
    while not (handle.status().get("snapshots", 0) >= 1 and len(read_file_sink(out, "out")) > N // 4):
        assert time.time() < deadline, f"no snapshot and output within 120 s: {handle.status()}"
        time.sleep(0.05)
    ray.kill(ray.get_actor("resume/coordinator", namespace="driftstream"), no_restart=False)
    result = attach("resume").wait(timeout=120)
    assert result.metrics.recoveries == 1
    assert attach("resume").describe()["restarts"] == 1
    handle.stop(timeout=60)  # removes the finished flow: its name is free again
    assert "resume" not in [f["name"] for f in list_flows()]
    assert read_file_sink(out, "out") == expected


def test_attach_to_a_flow_a_driver_runs(ray_session, tmp_path):
    """attach() reaches a flow that flow.start() runs elsewhere: its status, and a stop that
    the starting driver sees as the run's end (it keeps removing its own coordinator)."""
    from driftstream.engine import attach, list_flows

    out = tmp_path / "out"
    handle = build(str(out)).start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    other = attach("resume")
    assert other.describe()["detached"] is False
    deadline = time.time() + 120
    while not other.status().get("released"):
        assert time.time() < deadline
        time.sleep(0.05)
    other.stop(timeout=60)
    result = handle.wait(timeout=60)
    assert 0 < result.metrics.elements["numbers"] < N  # stopped mid-stream, through the attached handle
    assert "resume" not in [f["name"] for f in list_flows()]


def test_a_second_start_into_the_same_snapshots_is_refused_unless_resumed_or_fresh(ray_session, tmp_path):
    """A start from the beginning over the flow's own snapshots would discard them and replay
    every input into a FileSink that holds the output already (3,597 duplicates in a review):
    it is refused, saying both options; resume=True continues without a duplicate, fresh=True
    starts over from the first input."""
    from driftstream.engine.model.errors import FlowError

    out, snaps = tmp_path / "out", tmp_path / "snaps"
    options = dict(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(snaps))
    # Paced at 8,000/s: a second's input, snapshots taken through it (a resume starts past the
    # first input), three runs in 3 s of input rather than 12 at the kill tests' 2,000/s.
    build = lambda out: resume_flow.build(out, rate=8000)  # noqa: E731
    build(str(out)).run(**options)
    first = read_file_sink(out, "out")
    committed = SnapshotStore(str(snaps)).committed_ids()
    assert len(first) == N and committed
    started = time.time()
    with pytest.raises(FlowError, match=r"flow 'resume' has snapshots in .*Start with resume=True \(--resume\) to continue from the "
                                        r"newest snapshot, or with fresh=True \(--fresh\) to discard the snapshots"):
        build(str(out)).run(**options)
    assert time.time() - started < 15
    assert SnapshotStore(str(snaps)).committed_ids() == committed and read_file_sink(out, "out") == first  # nothing touched

    resumed = build(str(out)).run(resume=True, **options)
    assert read_file_sink(out, "out") == first  # the replay past the snapshot wrote nothing twice
    assert resumed.metrics.elements["numbers"] < N
    again = build(str(tmp_path / "again")).run(fresh=True, **options)
    assert again.metrics.elements["numbers"] == N  # from the first input
    assert read_file_sink(tmp_path / "again", "out") == first
