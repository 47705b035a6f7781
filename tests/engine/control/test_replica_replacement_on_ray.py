"""A replacement replica on Ray (issue 58): an instance that lost a replica gets a new one,
restored from the newest committed snapshot and caught up from its senders' logs while the live
replicas' output goes on; nothing rolls back. Once caught up it is a full member: under
``verify="first"`` it can become the primary, under ``"majority"`` it votes (a later flip of
another replica is still outvoted, which needs three live replicas). The output is the
fault-free run's, element for element."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.replica_launch import replica_name
from driftstream.engine.testing import MemorySource, PacedSource, fault_at, kill_at

from tests.engine.control.test_exactly_once import N, checksum
from tests.engine.runtime.test_reexecuted_step_on_ray import by_key



def build(name: str, sink, rate: int = 0) -> Flow:
    """tests/engine/runtime/test_reexecuted_step_on_ray.py's flow (six keys in turn through an
    order-sensitive running checksum), read at ``rate`` elements/s (0: at once): 6-8 s of
    input, for a replacement to join and a second fault after it (votes' epochs stretch under load)."""
    items = [("k%d" % (10 + (i // 200) % 6), i) for i in range(N)]
    flow = Flow(name)
    flow.source(PacedSource(items, rate=rate, partitions=3) if rate else MemorySource(items, partitions=3), name="src") \
        .key_by(by_key, name="by_key").stateful_map(checksum, name="sum").sink(sink)
    return flow

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("replaced-ref")
    build("rr-ref", FileSink(out, name="out")).run(parallelism=2)
    return read_file_sink(out, "out")


def _progress(out, handle_box: list, joined: int = 0):
    """Lines of output so far; 0 until ``joined`` replacements joined (status() polled)."""
    def progress() -> int:
        lines = len(read_file_sink(out, "out")) if out.exists() else 0
        if not joined:
            return lines
        try:
            recoveries = handle_box[0].status().get("recoveries", []) if handle_box else []
        except Exception:  # noqa: BLE001  (the run ended between two polls)
            return 0
        done = sum(r["kind"] == "replica replaced" and r["first_output_s"] is not None for r in recoveries)
        return lines if done >= joined else 0
    return progress


def _run(name: str, tmp_path, threads, rate: int, **options) -> tuple:
    """The flow at parallelism 2, exactly-once, 0.2 s snapshots, under ``options``; ``threads``:
    functions of ``(out, handle box)`` starting the fault threads. Returns ``(metrics, output)``."""
    out, box = tmp_path / name, []
    started = [start(out, box) for start in threads]
    box.append(build(name, FileSink(out, name="out"), rate).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), recovery="local",
        **options))
    result = box[0].wait()
    for thread in started:
        thread.join(timeout=5)
        assert not thread.errors, thread.errors
    return result.metrics, read_file_sink(out, "out")


def failures(metrics) -> list:
    """The kinds of a run's recoveries but its replacements' (a replacement's record, or why none
    was made, comes once its actor is up: its place among the others depends on timing)."""
    return [r["kind"] for r in metrics.recovery_s if not r["kind"].startswith(("replica replaced", "replica not replaced"))]


def _joined(metrics, count: int) -> list:
    replaced = [r for r in metrics.recovery_s if r["kind"] == "replica replaced"]
    assert len(replaced) >= count and all(r["restored"] == [] and r["first_output_s"] is not None for r in replaced[:count]), replaced
    return replaced


def test_a_killed_primary_is_replaced_and_its_replacement_takes_over_later(ray_session, tmp_path, expected):
    """r = 2, "first": the primary of the stateful instance dies (its replica takes over) and a
    new replica restores and catches up; then the original replica dies too: the replacement
    becomes the primary. No restore of any instance, no rollback, the fault-free output."""
    first, second = "rr-first/by_key/0", replica_name("rr-first/by_key/0", 1)
    kills = [lambda out, box: kill_at(_progress(out, box), [(first, N // 5)]),
             lambda out, box: kill_at(_progress(out, box, joined=1), [(second, N // 2)])]
    metrics, got = _run("rr-first", tmp_path, kills, 1000, replicas=2, standbys=1)  # the replacement: the standby
    assert failures(metrics) == ["failover", "failover"], metrics.recovery_s
    assert [r["kind"] for r in metrics.recovery_s][:2] == ["failover", "replica replaced"]  # the second kill waited for it to join
    assert metrics.restores == {} and metrics.failovers == 2  # no instance rolled back
    _joined(metrics, 1)
    assert got == expected


def test_an_outvoted_replica_is_replaced_and_its_replacement_votes(ray_session, tmp_path, expected):
    """r = 3, "majority": a flipped secondary is outvoted and replaced; after the replacement
    caught up, a flip in the other original secondary is still outvoted (two against one: the
    replacement voted with the primary)."""
    flips = [lambda out, box: fault_at(_progress(out, box), replica_name("rr-maj/by_key/0", 1), N // 12, "flip", seed=3),
             lambda out, box: fault_at(_progress(out, box, joined=1), replica_name("rr-maj/by_key/0", 2), N // 4, "flip", seed=5)]
    metrics, got = _run("rr-maj", tmp_path, flips, 750, replicas=3, verify="majority", standbys=1)
    assert [d["kind"] for d in metrics.dissents] == ["corruption", "corruption"], metrics.dissents
    assert [len(d["replicas"]) for d in metrics.dissents] == [1, 1] and metrics.dissents[0]["replicas"] != metrics.dissents[1]["replicas"]
    assert failures(metrics) == ["replica lost", "replica lost"], metrics.recovery_s
    assert [r["kind"] for r in metrics.recovery_s][:2] == ["replica lost", "replica replaced"]
    assert metrics.restores == {}
    _joined(metrics, 1)
    assert got == expected
