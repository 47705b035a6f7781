"""Rescaling a flow that runs with replicas on Ray (``replicas=2``, ``recovery="local"``): the
drained snapshot as any rescale, then every stage restarts at the new parallelism with two
replicas of each keyed instance, both restoring the instance's part. After it the run is a
replicated run as any other: a killed primary fails over to its replica, restoring nothing.
The output is a failure-free run's, element for element."""

from __future__ import annotations

import time

import pytest
import ray

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.replica_launch import replica_name
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import actor_of

from tests.engine.control.test_exactly_once import N, build, failure_free_output
from tests.engine.control.test_replica_replacement_on_ray import failures

pytestmark = pytest.mark.ray


def wait_for(count, n: int, handle, timeout: float = 60.0) -> None:
    """Poll ``count()`` until it reaches ``n``, failing with the flow's status after ``timeout`` s (a hang, not a timing)."""
    deadline = time.time() + timeout
    while count() < n:
        assert time.time() < deadline, f"{count()} of {n} after {timeout} s: {handle.status()}"
        time.sleep(0.05)


@pytest.mark.parametrize("verify", ["first", "majority", "sample:2"])
def test_a_replicated_flow_rescaled_2_3_2_then_a_killed_primary_fails_over(ray_session, tmp_path, tmp_path_factory, verify):
    """2 -> 3 -> 2 mid-stream: at 3 the new instance has its replica too (killed before the
    rescale back); at 2, the primary of ``by_key/0`` is killed: its replica, restored from the
    second rescale's snapshot as the primary was, takes over (kind ``"failover"``, no restore).
    Under ``"majority"`` the votes go on over the relaunched replicas (the gate releases nothing an
    epoch's vote has not passed, so the output would stop short without them): no dissent. Under
    ``"sample:2"`` (refused before) each rescale's snapshot is one the votes certify: an even id."""
    expected = failure_free_output(tmp_path_factory)
    name = f"rr-{verify.replace(':', '')}"
    out = tmp_path / "out"

    def released() -> int:
        return len(read_file_sink(out, "out")) if out.exists() else 0

    handle = build(name, FileSink(out, name="out"), paced=True, rate=1000).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas=2, verify=verify)
    try:
        with pytest.raises(FlowError, match="would leave it without replicas"):
            handle.rescale(1)  # fused at 1, every stage reads a source: refused, and the run goes on
        wait_for(released, N // 6, handle)
        assert handle.rescale(3)["to"] == 3
        assert actor_of(replica_name(f"{name}/by_key/2", 1)) is not None  # the new instance runs as two replicas
        wait_for(released, N // 3, handle)
        # The new instance's replica dies: its replacement waits to start (a process) when the
        # rescale comes, which takes the instance away (a pending replacement failed the run before).
        ray.kill(actor_of(replica_name(f"{name}/by_key/2", 1)), no_restart=True)
        wait_for(lambda: sum(r["kind"] == "replica lost" for r in handle.status()["recoveries"]), 1, handle)
        report = handle.rescale(2)
        assert report["to"] == 2
        assert replica_name(f"{name}/by_key/0", 1) in report["resets_s"]  # a replica kept is reset in place, not started anew
        assert actor_of(replica_name(f"{name}/by_key/2", 2)) is None  # the instance gone, its replica's replacement too
        records = handle.status()["rescales"]
        rescales = [(r["from"], r["to"]) for r in records]
        primary = actor_of(f"{name}/by_key/0")
        assert released() < N  # mid-stream: output is still to come, from the replica once promoted
        ray.kill(primary, no_restart=True)
    finally:
        result = handle.wait(timeout=120)
    assert rescales == [(2, 3), (3, 2)]
    if verify == "sample:2":
        assert [r["snapshot"] % 2 for r in records] == [0, 0], records
    status = result.metrics
    assert failures(status) == ["replica lost", "failover"], status.recovery_s  # the rescales are no recoveries
    assert status.restores == {} and status.failovers == 1  # the replica took over without a restore
    assert status.dissents == []
    assert read_file_sink(out, "out") == expected  # same payloads, same Metas, same order
