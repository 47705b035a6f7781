"""Local recovery on Ray (``recovery="local"``): a killed instance is replaced alone, restores
the newest committed snapshot and has its inputs replayed; the other instances never roll
back, and the output is a failure-free run's, element for element. What it cannot handle (the
acker died) rolls every instance back and says why."""

from __future__ import annotations

import argparse

import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.testing import MemorySource, PacedSource, kill_at

from tests import reference
from tests.engine.control.test_exactly_once import N, build, checksum, failure_free_output

pytestmark = pytest.mark.ray


def run_killing(name: str, victim: str, tmp_path, tmp_path_factory) -> tuple:
    """Run ``build``'s flow at parallelism 2 under recovery="local", killing ``victim`` once a
    third of the output is out (after the first commits); ``(result, plan, output, expected)``."""
    expected = failure_free_output(tmp_path_factory)
    out = tmp_path / name
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [(f"{name}/{victim}", N // 3)])
    # 6 s of input, not build's 2 s: on a loaded CI machine the whole output was out before
    # the killer thread looked again (no live actor played the victim).
    flow = build(name, FileSink(out, name="out"), paced=True, rate=1000)
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    return result, flow.plan(2), read_file_sink(out, "out"), expected


@pytest.mark.parametrize("victim", ["by_key/0", "src/1"])
def test_a_killed_instance_restores_alone(ray_session, tmp_path, tmp_path_factory, victim):
    """A stateful instance (its senders replay, its output below the cut is dropped) or a
    source instance (it re-reads from T, its receivers cancel what it sent past the cut). Its
    replacement is the standby recovery="local" keeps by default: no process starts while the
    others work (a new one took up to twice a global recovery's time to the first output)."""
    name = "lr-" + victim.split("/")[0]
    result, plan, got, expected = run_killing(name, victim, tmp_path, tmp_path_factory)
    label = next(i.label for i in plan.instances if plan.actor_name(i) == f"{name}/{victim}")
    (recovery,) = result.metrics.recovery_s
    assert recovery["kind"] == "local", recovery
    assert recovery["snapshot"] is not None  # restored a committed snapshot, not the beginning
    assert list(recovery["resets_s"]) == [f"{name}/{victim} (standby)"], recovery  # a started actor took its place
    assert result.metrics.restores == {label: 1}  # only the killed instance restored; the others never did
    assert got == expected  # same payloads, same Metas, same order


def _parity_counts(name: str, sink, paced: bool, rate: float = 3000) -> Flow:
    """``build``'s flow whose keyed stage feeds a second one: a count per parity of the sums
    (``paced``: ``rate`` elements a second)."""
    items = [("k%d" % (i % 7), i) for i in range(N)]
    flow = Flow(name)
    (flow.source(PacedSource(items, rate=rate, partitions=3) if paced else MemorySource(items, partitions=3), name="src")
         .key_by(lambda x: x[0], name="by_key").stateful_map(checksum, name="sum")
         .key_by(lambda v: v[2] % 2, name="par").stateful_map(lambda n, v: ((n or 0) + 1, [v[2] % 2, (n or 0) + 1]), name="count")
         .sink(sink))
    return flow


def test_a_killed_instance_feeding_another_stage_restores_alone(ray_session, tmp_path, tmp_path_factory):
    """The killed instance's receivers take their part before its senders re-send it anything:
    its output reaching a receiver first was dropped as the dead one's batches in flight, or
    cancelled with them (its sender is the same instance): output short, or a tombstone that
    never met its element, in 2 runs of 3 before."""
    expected = reference.failure_free_output(
        "lr-parity", tmp_path_factory, lambda out: _parity_counts("lr-par-ref", FileSink(out, name="out"), paced=False).run(parallelism=2))
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("lr-par/by_key/0", N // 3)])
    result = _parity_counts("lr-par", FileSink(out, name="out"), paced=True).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert [r["kind"] for r in result.metrics.recovery_s] == ["local"] and result.metrics.restores == {"1/0": 1}
    assert read_file_sink(out, "out") == expected


def test_the_acker_killed_falls_back_to_a_global_rollback(ray_session, tmp_path, tmp_path_factory):
    result, plan, got, expected = run_killing("lr-acker", "acker", tmp_path, tmp_path_factory)
    (recovery,) = result.metrics.recovery_s
    assert recovery["kind"] == "global (fallback: the acker died)"
    assert result.metrics.restores == {i.label: 1 for i in plan.instances}
    assert got == expected


def test_the_other_partitions_release_while_the_replacement_starts(ray_session, tmp_path):
    """Each instance is told its own frontier while the killed one recovers (ordering/
    receiver_frontiers.py): the other partitions' longest gap between two releases is a
    fraction of the killed partition's wait for its replacement (a new process here), which
    under one watermark they waited out too."""
    from driftstream.examples.benchmarks import local_recovery as bench

    args = argparse.Namespace(rate=2_000, seconds=3.0, parallelism=2, kill_at=1.5, snapshot_interval=0.25, standbys=0)
    run = bench.one_run("lr-gap", "local", args.kill_at, args, str(tmp_path))
    assert run["killed"] and run["kinds"][0] == "local" and set(run["restores"]) == {"1/1"}, run
    assert run["first_output_s"] is not None and run["others_longest_gap_s"] < run["first_output_s"] / 2, run


def test_the_acker_refuses_a_second_local_failure_in_the_same_call_changing_nothing(ray_session):
    """The acker's reasons to refuse (here: a replacement still catching up) are asked in the
    call that takes a failure in, not in a round trip before it: one answer, nothing changed by
    a refusal (the holds and the replacement catching up are the first failure's)."""
    import ray

    from driftstream.engine.model.data_plane import PlaneKey
    from driftstream.engine.runtime.actors import AckerActor
    from driftstream.ordering.meta import BOTTOM

    acker = AckerActor.remote(2, PlaneKey.new(), local=True)
    try:
        ray.get(acker.connect.remote({}, {}, None, [(0, 0), (0, 1)]))
        cut, why = ray.get(acker.local_fail.remote((1, 0), 3, 5, [(0, 0), (0, 1), (1, 1)], BOTTOM))
        assert why is None and cut is not None
        before = ray.get(acker.status.remote())
        assert before["catching_up"] == {"1/0": BOTTOM} and len(before["holds"]) == 4  # the survivors' and its own
        assert ray.get(acker.local_fail.remote((1, 1), 4, 6, [(0, 0), (0, 1), (1, 0)], BOTTOM)) == (None, "a replacement was still catching up")
        after = ray.get(acker.status.remote())
        assert (after["catching_up"], after["holds"]) == (before["catching_up"], before["holds"])
    finally:
        ray.kill(acker, no_restart=True)
