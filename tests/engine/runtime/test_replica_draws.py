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

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource

from tests.engine.runtime.test_simulated_nondeterminism import _inconsistency, _running

DATA = [("abc"[i % 3], i) for i in range(40)]


def _flow(declared: bool) -> Flow:
    draws = itertools.count(1)
    f = Flow("replica-draws")
    (f.source(MemorySource(DATA, partitions=2)).key_by(lambda x: x[0]).map(lambda x: (x[0], x[1], next(draws) % 7), name="draw",
                                                                            deterministic=not declared)
     .key_by(lambda x: x[0]).stateful_map(_running).sink(MemorySink("out")))
    return f


def _sim(seed: int, declared: bool = True, replicas: int = 2, verify: str = "first", deaths: int = 2) -> Simulation:
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(5, 10, 20)[seed % 3] / 1000, recovery="local",
                       replicas=replicas, verify=verify)
    return Simulation(_flow(declared).plan(2), config, replica_crashes=deaths)


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
