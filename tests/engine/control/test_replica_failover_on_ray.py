"""Replicas on Ray (``replicas=2``, ``verify="first"``): every keyed instance runs as two stage
actors; killing one costs no restore and no rollback anywhere. A replica that is not the
primary is dropped from the fan-out; a dead primary's receivers cancel what it sent at or
above the cut and the live replica, promoted, sends its own again. The output is a
failure-free run's, element for element."""

from __future__ import annotations

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.replica_launch import replica_name
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import kill_at

from tests import reference
from tests.engine.control.test_exactly_once import N
from tests.engine.control.test_local_recovery_on_ray import _parity_counts
from tests.engine.control.test_replica_replacement_on_ray import failures

pytestmark = pytest.mark.ray


def test_a_killed_replica_then_two_killed_primaries_restore_nothing(ray_session, tmp_path, tmp_path_factory):
    """A secondary of the second keyed stage dies, then at once the primaries of a first-stage
    instance (its output feeds the second stage: cancelled at the receivers, sent again by the
    replica) and of a second-stage one, as a node's loss would kill them; with the promotion
    replaced by a global rollback, every instance restores."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    kills = [(replica_name("rp-par/par/0", 1), N // 5), (("rp-par/by_key/1", "rp-par/par/1"), N // 2)]
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, kills)
    # 6 s of input: at 2 s the second kill once came after the last watermark (the sink's lines
    # half behind the input under CI's load), and the run was ending: a global rollback instead
    result = _parity_counts("rp-par", FileSink(out, name="out"), paced=True, rate=1000).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=2)
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert failures(result.metrics) == ["replica lost", "failover", "failover"], result.metrics.recovery_s
    assert result.metrics.restores == {} and result.metrics.failovers == 2  # no instance restored a snapshot, none rolled back
    assert read_file_sink(out, "out") == expected


def test_what_replicas_do_not_run_on_ray_is_refused(ray_session):
    flow = _parity_counts("rp-refused", FileSink("/nonexistent", name="out"), paced=False)
    with pytest.raises(FlowError, match="verify='first'"):
        flow.run(parallelism=2, guarantee="exactly-once", recovery="local", replicas=2, verify="reexecute:2")


def test_a_killed_source_instance_restores_alone_beside_replicas(ray_session, tmp_path, tmp_path_factory):
    """A source instance has no replicas: local recovery replaces it, and every replica of its
    receivers takes its part (cancels, the acker's hold for each); the replacement fans out."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rp-src/src/0", N // 6)])
    result = _parity_counts("rp-src", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=2)
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert [r["kind"] for r in result.metrics.recovery_s] == ["local"] and result.metrics.restores == {"0/0": 1}
    assert read_file_sink(out, "out") == expected
