"""Steps declared deterministic=False in replicated instances on Ray (replica_draws.py): the
primary draws, the other replicas take its draws. A killed primary's successor redraws nothing
already drawn (every running sum is the sum of its key's released draws, every element once);
under ``verify="majority"`` the replicas agree (no dissent), where the same step undeclared is
named as likely not deterministic."""

from __future__ import annotations

import random

import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import PacedSource, kill_at

pytestmark = pytest.mark.ray

N = 3000


def _draw(x):
    return [x[0], x[1], random.randrange(7)]  # each replica's process draws other values


def _running(total, x):
    total = (total or 0) + x[2]
    return total, [x[0], x[1], x[2], total]


def _flow(name: str, out, declared: bool = True, rate: int = 800) -> Flow:
    """The draw after a key_by, in a replicated stage, then a running sum of the draws per key
    (in the next stage: a stateful step takes a key_by right before it)."""
    flow = Flow(name)
    (flow.source(PacedSource([("k%d" % (i % 5), i) for i in range(N)], rate=rate, partitions=2), name="src")
         .key_by(lambda x: x[0], name="by_key").map(_draw, name="draw", deterministic=not declared)
         .key_by(lambda x: x[0], name="rekey").stateful_map(_running, name="sum").sink(FileSink(out, name="out")))
    return flow


def _consistent(out) -> None:
    """Every element once; per key in t order each released sum is the sum of the released draws."""
    got = [value for _, value in read_file_sink(out, "out")]
    assert sorted(i for _, i, _, _ in got) == list(range(N))
    sums: dict = {}
    for key, i, value, total in got:
        sums[key] = sums.get(key, 0) + value
        assert total == sums[key], f"element {i} of {key}: released sum {total}, released draws {sums[key]}"


def test_a_killed_primary_s_successor_takes_the_draws_and_draws_nothing_again(ray_session, tmp_path):
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rd-kill/by_key/0", N // 5)])
    result = _flow("rd-kill", out).run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                       snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=2)
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    kinds = [r["kind"] for r in result.metrics.recovery_s]
    assert kinds[0] == "failover" and not any(k.startswith("global") for k in kinds) and result.metrics.restores == {}, kinds
    _consistent(out)


def test_majority_agrees_on_declared_draws_and_names_undeclared_ones(ray_session, tmp_path):
    result = _flow("rd-vote", tmp_path / "out").run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                                    snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=3, verify="majority")
    assert result.metrics.dissents == [] and result.metrics.recovery_s == []
    _consistent(tmp_path / "out")
    with pytest.raises(FlowError, match="likely not deterministic"):
        _flow("rd-undeclared", tmp_path / "undeclared", declared=False).run(
            parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps-u"), recovery="local",
            replicas=3, verify="majority")


def test_majority_agrees_after_the_primary_of_the_draws_died(ray_session, tmp_path):
    """r = 3: the promoted replica draws only what no draw came for; had it drawn again what the
    dead primary drew, the replica left (which took the dead one's draws) would disagree with it."""
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rd-vkill/by_key/1", N // 5)])
    result = _flow("rd-vkill", out).run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                        snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=3, verify="majority")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    kinds = [r["kind"] for r in result.metrics.recovery_s]
    assert kinds[0] == "failover" and not any(k.startswith("global") for k in kinds), kinds
    assert result.metrics.dissents == []
    _consistent(out)


def test_a_replacement_replica_takes_the_primary_s_draws(ray_session, tmp_path):
    """r = 3 under majority: a secondary of the draws' instance killed; its replacement restores
    a snapshot, takes the primary's draws it holds (and its log below the primary's watermark then),
    and votes with the others: no dissent. (Input for ~7 s: the replacement's process starts meanwhile.)"""
    out = tmp_path / "out"
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("rd-repl/by_key/0/replica-1", N // 5)])
    result = _flow("rd-repl", out, rate=400).run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                       snapshot_dir=str(tmp_path / "snaps"), recovery="local", replicas=3, verify="majority")
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    kinds = [r["kind"] for r in result.metrics.recovery_s]
    assert kinds[0] == "replica lost" and "replica replaced" in kinds and not any(k.startswith("global") for k in kinds), kinds
    assert result.metrics.dissents == []
    _consistent(out)
