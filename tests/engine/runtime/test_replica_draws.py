"""Steps declared deterministic=False in replicated instances (replica_draws.py), on the simulator:
the primary draws, the other replicas take its draws; a seeded primary's death hands the draws to
its successor, which draws only what no draw came for. The flow: a ``key_by``, a ``map`` whose draw
comes from a counter outside the engine (each replica's call gives another value) in the
replicated stage, a second ``key_by``, a running sum of the draws, a sink. Whatever the schedule
and the deaths, each released sum is the sum of its key's released draws before it, every element
is released once, and no replica that was never the primary drew anything; under
``verify="majority"`` the replicas agree, where the same step undeclared is named."""

from __future__ import annotations

import itertools
import os
import random
from typing import Optional

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.runtime.logged_step import LoggedStep
from driftstream.engine.runtime.operators import Map
from driftstream.engine.runtime.replica_draws import ReplicaDraws, _Acks
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.snapshots.output_log import OutputLog

from tests.engine.runtime.test_simulated_nondeterminism import _inconsistency, _running

DATA = [("abc"[i % 3], i) for i in range(40)]


def _flow(declared: bool) -> Flow:
    draws = itertools.count(1)
    f = Flow("replica-draws")
    (f.source(MemorySource(DATA, partitions=2)).key_by(lambda x: x[0]).map(lambda x: (x[0], x[1], next(draws) % 7), name="draw",
                                                                            deterministic=not declared)
     .key_by(lambda x: x[0]).stateful_map(_running).sink(MemorySink("out")))
    return f


def _sim(seed: int, declared: bool = True, replicas: int = 2, verify: str = "first", deaths: int = 2, flips: int = 0) -> Simulation:
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(5, 10, 20)[seed % 3] / 1000, recovery="local",
                       replicas=replicas, verify=verify)
    return Simulation(_flow(declared).plan(2), config, replica_crashes=deaths, replica_flips=flips)


def _drew_only_as_primary(sim: Simulation) -> list:
    """The replicas that drew though they never were the primary (of those alive at the end)."""
    primaries = {sets[0] for sets in sim.replicas.sets.values()}
    return [inc for inc, (_, host) in sim.replicas.hosts.items()
            if host.draws is not None and inc not in primaries and any(c["drawn"] for c in host.draws.counts().values())]


def test_replicas_take_the_primary_s_draws_through_its_deaths():
    failovers = 0
    for seed in range(40):
        sim = _sim(seed)
        out = sim.run().output("out")
        assert _inconsistency(out) is None, (seed, _inconsistency(out))
        assert _drew_only_as_primary(sim) == [], seed
        failovers += sim.replicas.failovers
    assert failovers >= 10  # primaries died (half the deaths, about)


def test_secondaries_take_draws_they_did_not_make():
    sim = _sim(1, deaths=0)
    sim.run()
    counts = [host.draws.counts()["draw"] for _, host in sim.replicas.hosts.values() if host.draws is not None]
    assert sorted(c["drawn"] > 0 for c in counts) == [False, False, True, True]  # two instances: the primaries drew
    assert all(c["taken"] > 0 for c in counts if not c["drawn"])


@pytest.mark.parametrize("seed", range(8))
def test_majority_agrees_on_declared_draws(seed):
    sim = _sim(seed, replicas=3, verify="majority")
    result = sim.run()
    assert result.metrics.dissents == [] and _inconsistency(result.output("out")) is None


def test_majority_names_undeclared_draws():
    named = [d for seed in range(4) for d in _sim(seed, declared=False, replicas=3, verify="majority", deaths=0).run().metrics.dissents]
    assert any(d["kind"] == "likely non-determinism" and "draw" in d["steps"] for d in named), named[:2]


# -- global rollbacks: votes on flipped replicas, then deaths --------------------------------------

#: Seeded runs of r = 3 "majority" with three deaths and two flips in the fast tier (~0.08 s each),
#: and in the slow tier (``DRIFTSTREAM_MORE_SEEDS``; by hand: see the architecture doc).
ROLLBACK_SEEDS = 200
MORE_ROLLBACK_SEEDS = int(os.environ.get("DRIFTSTREAM_MORE_SEEDS", "75"))  # (the suite's time: 1,500 by hand)


def _rolled_back(seed: int) -> Simulation:
    """A flipped primary (or no majority) rolls every replica back to a certified snapshot; the
    deaths then promote replicas the rollback restored."""
    return _sim(seed, replicas=3, verify="majority", deaths=3, flips=2)


def _went_wrong(sim: Simulation) -> Optional[str]:
    """Run ``sim``; what it did wrong with the draws: its output inconsistent, a replica that never was the
    primary drew, or the replicas disagreed where no flip was (each would draw its own)."""
    result = sim.run()
    flipped = {f.incarnation for f in sim.votes.flips}
    unflipped = [d for d in sim.votes.dissents if not set(d.replicas) & flipped]
    return _inconsistency(result.output("out")) or (_drew_only_as_primary(sim) and "a secondary drew") or (unflipped and f"dissent {unflipped[0]}") or None


def _promoted_since_the_rollback(sim: Simulation) -> list:
    """The live primaries that a rollback restored as another replica and a death promoted."""
    return [inc for inc, (_, host) in sim.replicas.hosts.items()
            if host.draws is not None and any(step.replica.promoted for step in host.draws.steps.values())]


def test_a_replica_restored_by_a_rollback_and_promoted_takes_its_log_s_draws():
    """Seed 47: a vote rolls back to the beginning, a primary dies; its successor found an input in
    its log (the draw released before the rollback), which it neither drew nor took (KeyError)."""
    sim = _rolled_back(47)
    assert _went_wrong(sim) is None
    assert sim.votes.rollbacks and _promoted_since_the_rollback(sim)


def test_a_vote_s_rollback_restores_the_certified_snapshot_the_logs_were_trimmed_at():
    """Seed 187: a vote rolls back to certified snapshot 2 at t 14 (the logs trimmed below it), a
    second one finds it pruned by the newer commits since (at its t again, not certified): it went
    back to the beginning and drew again what the sinks held below 14. The store keeps it now."""
    sim = _rolled_back(187)
    assert _went_wrong(sim) is None
    assert [sid for sid, *_ in sim.votes.rollbacks] == [2, 2]


def test_a_vote_s_rollback_to_the_beginning_finds_every_draw_logged():
    """Seed 245 of ``"sample:2"`` (its sinks take the primary's output at once): snapshot 2 commits,
    which no vote certifies (epoch 1 is not sampled), and the logs were trimmed below it; a flipped
    primary rolls back to the beginning, which drew again what the sinks held below it. The logs
    are kept back to the snapshot a vote's rollback restores."""
    sim = _sim(245, replicas=3, verify="sample:2", deaths=3, flips=3)
    assert _went_wrong(sim) is None
    assert sim.votes.dissents[0].action == "rolled back to the beginning" and sim.votes.rollbacks[0][0] is None


def _waiting_on_its_log(sim: Simulation) -> Optional[tuple]:
    """An instance one of whose other replicas waits for the primary's draw of an input its own log
    holds (a global rollback restored it with the primary's log), or None."""
    for instance, incs in sim.replicas.sets.items():
        for inc in incs[1:]:
            draws = sim.replicas.hosts[inc][1].draws
            if draws is not None and any(key[0] in step.log.replay for step in draws.steps.values() for key in step.replica.waiting):
                return instance
    return None


def test_a_primary_killed_while_another_waits_for_a_draw_its_log_holds_is_succeeded_without_drawing_it():
    """A global rollback to the older of two snapshots (the draws above it released before), then
    the primary killed while another replica waits for the draw of an input in its log: the
    successor takes the log's entry. Drawn again, the sums released before the rollback disagree
    (7 of 40 seeds); before the fix, the successor never took its log (KeyError)."""
    for seed in range(40):
        sim = _sim(seed, replicas=2 + seed % 2, deaths=0)
        while sim.commits < 2 and sim.step():
            pass
        sim.restart_all(Manifest.from_json(sim.store.read_manifest(sim.store.committed_ids()[0])), "the test's rollback")
        instance = None
        while instance is None and sim.step():
            instance = _waiting_on_its_log(sim)
        assert instance is not None, seed
        sim.replica_faults.kill(instance, sim.replicas.sets[instance][0])
        assert _inconsistency(sim.run().output("out")) is None, seed


def test_a_promoted_replica_writes_again_what_it_takes_from_its_log():
    """Its log may hold a dead primary's entry that the store has since replaced with a successor's
    draw: a later restore must find the entry it used. An original primary's log is the store's:
    what it takes from it is not written again."""
    m = (1, 0, 0, 1, (), False)
    written = {}
    for promoted in (False, True):
        step = LoggedStep(Map("draw", lambda x: 1 / 0), OutputLog(), flat=False)  # never drawn: the log has it
        step.log.replay[m] = [(m, 0.5, None)]
        step.replica = ReplicaDraws(not promoted, _Acks({}), random.Random(0), lambda entries: None)
        if promoted:
            step.replica.promote(step, lambda entries: None)
        assert step.run([(m, 1, None)]) == [(m, 0.5, None)]
        written[promoted] = step.log.pending
    assert written == {False: [], True: [(m, [(m, 0.5, None)])]}


def test_rollbacks_deaths_and_flips_keep_declared_draws_consistent():
    wrong, rollbacks, promoted = [], 0, 0
    for seed in range(ROLLBACK_SEEDS):
        sim = _rolled_back(seed)
        why = _went_wrong(sim)
        if why is not None:
            wrong.append((seed, why))
        rollbacks += len(sim.votes.rollbacks)
        promoted += bool(sim.votes.rollbacks and _promoted_since_the_rollback(sim))
    assert wrong == []
    assert rollbacks >= ROLLBACK_SEEDS // 5 and promoted, (rollbacks, promoted)  # the seeds reach the fault (rarely: see the crashes= test)


@pytest.mark.slow
def test_more_seeds_of_rollbacks_deaths_and_flips_keep_declared_draws_consistent():
    seeds = range(ROLLBACK_SEEDS, ROLLBACK_SEEDS + MORE_ROLLBACK_SEEDS)
    assert [(seed, why) for seed in seeds if (why := _went_wrong(_rolled_back(seed))) is not None] == []
