"""replicas=2, verify="first" on the simulator (issue 58, design item 4): every keyed instance
runs as two replicas fed the same input; the receivers take the primary's stream, and a
replica's death, the primary's too, restores nothing. Over hundreds of seeds of the keyed
flows local recovery's tests use, with replicas killed at any step, every output is the
failure-free one and no instance restored."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource

from tests.engine.runtime.test_local_recovery import DATA, step_to_end
from tests.pipelines import STATE_REKEY_ENTRIES, STATE_REKEY_STATE, build
from tests.reference import reference_outputs

#: Seeded runs per flow (each ~0.03 s, ~1.4 replica deaths and ~0.7 failovers a run).
SEEDS = 100

FLOWS = {"state-rekey-state": STATE_REKEY_STATE, "entries": STATE_REKEY_ENTRIES, "fan-state": ["fan", "concat"]}


def _config(seed: int, **options) -> RunConfig:
    return RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local", replicas=2, **options)


def _run(flow: Flow, seed: int, replica_crashes: int = 3) -> tuple:
    """(simulation, output) of one seeded run at parallelism 2 or 3, through 0-2 acker shards."""
    sim = Simulation(flow.plan(2 + seed % 2), _config(seed), replica_crashes=replica_crashes, acker_shards=seed % 3)
    step_to_end(sim, f"seed {seed}", lambda: f"replica failures {sim.replicas.failures}")
    return sim, sim.run()


def _check_seeds(ops: list, seeds: range) -> None:
    flow = build("replicas", DATA, ops, partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, failures, failovers = [], 0, 0
    for seed in seeds:
        sim, result = _run(flow, seed)
        if result.output("out") != expected or result.metrics.restores or sim.restores:
            wrong.append((seed, sim.replicas.failures, result.metrics.restores))
        failures += len(sim.replicas.failures)
        failovers += sim.replicas.failovers
    assert not wrong, f"seeds whose output differs or that restored an instance (seed, replica failures, restores): {wrong[:5]}"
    # The seeds reached what they test: replicas died, primaries among them.
    assert failures > len(seeds) and failovers > len(seeds) // 2, (failures, failovers)


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_replica_deaths_give_the_failure_free_output_and_restore_nothing(name):
    _check_seeds(FLOWS[name], range(SEEDS))


@pytest.mark.slow  # 50 more seeds a flow: ~2-3 s a flow (1,500 were run by hand; the suite is kept under 20 minutes)
@pytest.mark.parametrize("name", ["state-rekey-state", "entries"])
def test_more_seeded_replica_deaths_give_the_failure_free_output(name):
    _check_seeds(FLOWS[name], range(SEEDS, SEEDS + 50))


def _counter_flow() -> Flow:
    f = Flow("replicas-doc")
    f.source(MemorySource(range(40), partitions=2)).key_by(lambda x: x % 3).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
    return f


def test_a_dead_primary_fails_over_to_its_replica_without_a_restore_or_a_rollback():
    """The first seed whose run kills a primary: its receivers switch to the live replica, the
    result's restores and recoveries are empty, and the replica is the instance's host now."""
    flow = _counter_flow()
    expected = reference_outputs(flow)["o"]
    for seed in range(40):
        sim, result = _run(flow, seed, replica_crashes=1)
        if sim.replicas.failovers:
            break
    else:
        raise AssertionError("no seed of 40 killed a primary")
    instance, dead, primary = sim.replicas.failures[0]
    assert primary and result.output("o") == expected
    assert result.metrics.restores == {} and result.metrics.recoveries == 0
    assert sim.local.incarnations[instance] == sim.replicas.sets[instance][0] != dead


def test_without_replica_crashes_the_replicas_change_no_output():
    flow = _counter_flow()
    expected = reference_outputs(flow)["o"]
    for seed in range(10):
        sim, result = _run(flow, seed, replica_crashes=0)
        assert result.output("o") == expected and not sim.replicas.failures
        assert len(sim.replicas.sets) == len(flow.plan(2 + seed % 2).instances) - len(flow.plan(2 + seed % 2).source_instances)


@pytest.mark.parametrize("options, message", [
    ({"replicas": 0}, "replicas is an int >= 1"),
    ({"replicas": 2}, "replicas build on local recovery"),
    ({"recovery": "local", "replicas": 2, "verify": "any"}, "verify is 'first'"),
    ({"recovery": "local", "replicas": 1, "verify": "majority"}, "verify='majority' needs replicas >= 2"),
])
def test_run_config_refuses_replicas_it_cannot_have(options, message):
    with pytest.raises(FlowError, match=message):
        RunConfig(**options)


def test_ray_refuses_what_its_replicas_do_not_run_before_it_starts():
    """verify='first', 'majority' and 'sample:N' run on Ray (tests/engine/control/test_replica_failover_on_ray.py,
    test_replica_voter_on_ray.py); 'reexecute:N' takes replicas=1."""
    with pytest.raises(FlowError, match="'reexecute:2' runs with replicas=1"):
        _counter_flow().run(2, runtime="ray", guarantee="exactly-once", recovery="local", replicas=2, verify="reexecute:2")


def test_replica_crashes_need_replicas():
    config = RunConfig(seed=0, guarantee="exactly-once", recovery="local")
    with pytest.raises(FlowError, match="replica_crashes need replicas > 1"):
        Simulation(_counter_flow().plan(2), config, replica_crashes=1)
