"""replicas={step name: r} on Ray (issue 58): only the stages holding a named step run as
replicas, each as its r; another keyed stage keeps one actor per instance. A replica of a named
stage killed costs no restore, an unnamed stage's instance killed recovers locally, and the
output is a failure-free run's, element for element."""

from __future__ import annotations

import threading
import time

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.replica_launch import replica_name
from driftstream.engine.testing import actor_of, kill_at

from tests import reference
from tests.engine.control.test_exactly_once import N
from tests.engine.control.test_local_recovery_on_ray import _parity_counts
from tests.engine.control.test_replica_replacement_on_ray import failures

pytestmark = pytest.mark.ray


def _seen_then_killed(progress, names: list, kills: list) -> threading.Thread:
    """A thread that, once there is output, records in its ``live`` which of the instance
    actors ``names`` a live actor plays, then kills as :func:`kill_at` does (its ``killer``)."""
    def run() -> None:
        while progress() < 1:
            time.sleep(0.02)
        thread.live.update({name: actor_of(name) is not None for name in names})
        thread.killer = kill_at(progress, kills)
        thread.killer.join()

    thread = threading.Thread(target=run, daemon=True)
    thread.live = {}  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_killed_replica_of_the_named_stage_restores_nothing_and_the_other_stage_has_none(ray_session, tmp_path, tmp_path_factory):
    """``count`` (stage ``par``) named with r=2: a secondary of ``par/0`` dies; ``by_key``,
    keyed too, runs one actor per instance."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    progress = lambda: len(read_file_sink(out, "out")) if out.exists() else 0  # noqa: E731
    names = ["rn/by_key/0", "rn/by_key/1", replica_name("rn/by_key/0", 1), replica_name("rn/by_key/1", 1),
             "rn/par/0", "rn/par/1", replica_name("rn/par/0", 1), replica_name("rn/par/1", 1)]
    seen = _seen_then_killed(progress, names, [(replica_name("rn/par/0", 1), N // 4)])
    result = _parity_counts("rn", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas={"count": 2})
    seen.join(timeout=5)
    assert not seen.killer.errors, seen.killer.errors
    assert seen.live == {name: "replica" not in name or "/par/" in name for name in names}, seen.live
    assert failures(result.metrics) == ["replica lost"] and result.metrics.restores == {}, result.metrics.recovery_s
    assert read_file_sink(out, "out") == expected


def test_named_stages_run_as_their_own_r(ray_session, tmp_path, tmp_path_factory):
    """``sum`` named with r=3, ``count`` with r=2: the third replica of ``by_key/0`` exists and
    dies (no restore); ``par/0`` has no third."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    progress = lambda: len(read_file_sink(out, "out")) if out.exists() else 0  # noqa: E731
    names = [replica_name("rnr/by_key/0", 2), replica_name("rnr/par/0", 1), replica_name("rnr/par/0", 2)]
    seen = _seen_then_killed(progress, names, [(replica_name("rnr/by_key/0", 2), N // 4)])
    result = _parity_counts("rnr", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas={"sum": 3, "count": 2})
    seen.join(timeout=5)
    assert not seen.killer.errors, seen.killer.errors
    assert seen.live == dict(zip(names, [True, True, False])), seen.live
    assert failures(result.metrics) == ["replica lost"] and result.metrics.restores == {}, result.metrics.recovery_s
    assert read_file_sink(out, "out") == expected



@pytest.mark.parametrize("named, victim, label", [("count", "by_key/0", "1/0"), ("sum", "par/0", "2/0")], ids=["above", "below"])
def test_a_killed_instance_of_an_unnamed_stage_restores_alone_beside_replicas(ray_session, tmp_path, tmp_path_factory, named, victim, label):
    """The killed instance has no replicas; the named stage is below it (its receivers' replicas
    take their part, the replacement fans out to them) or above it (its senders are replicated:
    only their primaries re-send what they logged for it; the secondaries, which logged the same
    items, connect to the replacement for a promotion and re-send nothing: before, it got every
    item twice and its output differed)."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    name = "rnu-" + named
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [(f"{name}/{victim}", N // 4)])
    result = _parity_counts(name, FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        replicas={named: 2})
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert [r["kind"] for r in result.metrics.recovery_s] == ["local"] and result.metrics.restores == {label: 1}, result.metrics.recovery_s
    assert read_file_sink(out, "out") == expected
