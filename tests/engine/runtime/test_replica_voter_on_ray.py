"""verify="majority" on Ray (issue 58, design item 5): every keyed instance runs as r stage
actors that digest each epoch (a snapshot interval) and vote in the acker; the primaries' sinks
get an epoch's output only once every instance passed it. A value flipped in one replica's
keyed state mid-run (the test fault hook, killing nothing) is found at the next epoch's end and
named in ``status()``; a corrupt secondary (r = 3) is outvoted and leaves the run (a lost
replica), a corrupt primary or a mismatch of two replicas rolls every instance back to the newest
committed snapshot; a killed primary fails over to a replica whose kept bundles go through its
gate. The output is the fault-free run's, element for element. Under ``verify="sample:N"`` the
same votes on one epoch in N, without the gate: a flipped secondary is found and named the same way,
its dissent saying the epoch's output had left."""

from __future__ import annotations

import time

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.replica_launch import replica_name
from driftstream.engine.model.errors import FlowGone
from driftstream.engine.testing import fault_at, kill_at

from tests.engine.control.test_replica_replacement_on_ray import failures
from tests.engine.runtime.test_reexecuted_step_on_ray import N, build

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("votes-ref")
    build("rv-ref", FileSink(out, name="out"), paced=False).run(parallelism=2)
    return read_file_sink(out, "out")


def _run_with_flip(name: str, tmp_path, replicas: int, victim: str, verify: str = "majority") -> tuple:
    """The flow at parallelism 2 under ``verify`` with ``replicas``, a value flipped in
    actor ``victim``'s keyed state once a sixth of the output is out; its status() polled until
    the run ends. Returns ``(the last status, the result's metrics, the output)``."""
    out = tmp_path / name
    injector = fault_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, victim, N // 6, "flip", seed=3)
    handle = build(name, FileSink(out, name="out"), paced=True).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas=replicas, verify=verify)
    status: dict = {}
    try:
        while True:
            try:
                got = handle.status()
            except FlowGone:  # it ended between two polls
                break
            if not got.get("running"):
                break
            status = got if got.get("dissents") else status
            time.sleep(0.1)
        result = handle.wait()
    finally:
        injector.join(timeout=5)
    assert not injector.errors and injector.faults, injector.errors
    return status, result.metrics, read_file_sink(out, "out")


def test_a_flipped_secondary_is_outvoted_and_leaves_the_run(ray_session, tmp_path, expected):
    status, metrics, got = _run_with_flip("rv-sec", tmp_path, 3, replica_name("rv-sec/by_key/0", 1))
    (dissent,) = metrics.dissents
    assert dissent["instance"] == "1/0" and dissent["kind"] == "corruption" and len(dissent["replicas"]) == 1, dissent
    assert len(set(dissent["digests"].values())) == 2 and dissent["t_range"][1] is not None
    assert status.get("dissents") == [dissent] or dissent["epoch"] is None  # in status() while the run went on (unless at its end)
    assert failures(metrics) == ["replica lost"] and metrics.restores == {}  # (then its replacement, or why not)
    assert got == expected


def test_a_mismatch_of_two_replicas_rolls_back(ray_session, tmp_path, expected):
    """r = 2: no majority, a global rollback to the newest committed snapshot (each certified: the
    primaries' parts wait for their gates). A flipped primary with r = 3 takes the same path (a
    "corruption" that rolls back: tests/ordering/test_epoch_votes.py; 4 of 4 hand runs on Ray)."""
    status, metrics, got = _run_with_flip("rv-two", tmp_path, 2, "rv-two/by_key/0/replica-1")
    (dissent,) = metrics.dissents
    assert dissent["instance"] == "1/0" and dissent["kind"] == "mismatch" and len(dissent["replicas"]) == 2, dissent
    assert [r["kind"] for r in metrics.recovery_s] == [f"global (vote: {dissent['kind']} of 1/0's replicas {dissent['replicas']} "
                                                       f"in t {tuple(dissent['t_range'])})"], metrics.recovery_s
    assert status.get("dissents") == [dissent] or dissent["epoch"] is None
    assert got == expected


def test_a_killed_primary_fails_over_through_the_gate(ray_session, tmp_path, expected):
    """r = 3: the primary of the stateful instance killed mid-run; the promoted replica writes
    what it kept that the sinks lack through its gate, and votes on with the other one."""
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rv-kill/by_key/0", N // 3)])
    result = build("rv-kill", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas=3, verify="majority")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert failures(result.metrics) == ["failover"] and result.metrics.restores == {}
    assert result.metrics.dissents == []
    assert read_file_sink(out, "out") == expected


def test_sample_finds_a_flipped_secondary_after_its_output_left(ray_session, tmp_path, expected):
    """``verify="sample:1"``, r = 3: no gate (the primaries' sinks write at once), every epoch voted
    after its output left; the flipped secondary is named as under majority, ``released``, and
    leaves the run; the primaries' output is the fault-free one."""
    status, metrics, got = _run_with_flip("rv-sample", tmp_path, 3, replica_name("rv-sample/by_key/0", 1), verify="sample:1")
    (dissent,) = metrics.dissents
    assert dissent["instance"] == "1/0" and dissent["kind"] == "corruption" and len(dissent["replicas"]) == 1, dissent
    assert dissent["released"] and "taken out of service" in dissent["action"]
    assert len(set(dissent["digests"].values())) == 2 and dissent["t_range"][1] is not None
    assert status.get("dissents") == [dissent] or dissent["epoch"] is None
    kinds = [r["kind"] for r in metrics.recovery_s]  # (then its replacement, or why not: replica_replacement.py)
    assert kinds[0] == "replica lost" and not any(k.startswith("global") for k in kinds) and metrics.restores == {}, kinds
    assert got == expected


def test_a_crash_under_sample_rolls_back_to_a_certified_snapshot(ray_session, tmp_path, expected):
    """``verify="sample:3"``, r = 2, the acker killed mid-run: a global rollback. Only the snapshots
    at the end of a voted epoch (ids 3, 6, ...) are certified; a newer committed one may hold what
    a corrupt primary settled unchecked, and restored by every replica it would be agreed on from
    then on. So the committed ones after the newest certified are set aside first (quarantined,
    saying why), as before a vote's rollback; the output is the fault-free one."""
    out, snaps = tmp_path / "out", tmp_path / "snaps"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rv-crash/acker", N // 3)])
    result = build("rv-crash", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.1, snapshot_dir=str(snaps), recovery="local",
        replicas=2, verify="sample:3")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    (rollback,) = [r for r in result.metrics.recovery_s if r["kind"].startswith("global")]
    assert rollback["snapshot"] is None or rollback["snapshot"] % 3 == 0, rollback
    for note in snaps.glob("*/CORRUPT.txt"):
        assert "not certified by a vote" in note.read_text() and "a global rollback" in note.read_text()
    assert read_file_sink(out, "out") == expected
