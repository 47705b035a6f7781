"""replicas={step name: r} (issue 58): only the stages holding a named step run as replicas,
each as its r, every other stage as one instance. The config's checks name the step and the
fix; in the simulator, over seeded runs of a flow with two keyed stages (one named, or both
with different r), replicas die (primaries too) and flip, and the output is the failure-free
one, with no restore but a vote's rollback."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource

from tests.engine.runtime.test_local_recovery import step_to_end

#: Seeded runs per case (each ~0.05-0.1 s)
SEEDS = 25


def two_keyed(name: str = "named") -> Flow:
    """source -> key_by -> running sums ("sums", stage 1) -> key_by -> count ("counts", stage 2)."""
    f = Flow(name)
    (f.source(MemorySource(range(60), partitions=2), name="src").key_by(lambda x: x % 3)
     .stateful_map(lambda s, x: ((s or 0) + x,) * 2, name="sums").key_by(lambda x: x % 4).count(name="counts").sink(MemorySink("o")))
    return f


def stage_of(plan, step: str) -> int:
    """The index of the stage holding ``step``."""
    return plan.stage_of[next(s.id for s in plan.steps if s.name == step)]


def _local(**options) -> RunConfig:
    return RunConfig(recovery="local", guarantee="exactly-once", **options)


def test_only_the_stage_holding_a_named_step_is_replicated():
    plan = two_keyed().plan(2)
    config = _local(replicas={"sums": 3})
    sums, counts = stage_of(plan, "sums"), stage_of(plan, "counts")
    assert sums != counts
    assert config.replicated(plan) == {k: 3 for k in plan.instances if k.stage == sums}
    assert (config.replicas_of(plan, sums), config.replicas_of(plan, counts), config.replica_count) == (3, 1, 3)
    # an int replicates every stage that reads no source, as before; each named stage takes its own r
    assert _local(replicas=2).replicated(plan) == {k: 2 for k in plan.instances if k.stage in (sums, counts)}
    assert _local(replicas={"sums": 2, "counts": 3}).replicated(plan) == {k: 2 if k.stage == sums else 3 for k in plan.instances if k.stage in (sums, counts)}
    assert _local(replicas={"sums": 1}).replicated(plan) == {} and _local().replicated(plan) == {}


@pytest.mark.parametrize("replicas, message", [
    ({"sum": 2}, "replicas names step 'sum', which flow 'named' does not have; its steps: counts, "),
    ({"src": 2}, "replicas names step 'src' of a source stage: sources have no replicas"),
])
def test_a_mapping_that_does_not_fit_the_flow_is_refused_before_it_runs(replicas, message):
    for run in (lambda: two_keyed().run(2, runtime="simulator", recovery="local", replicas=replicas),
                lambda: two_keyed().run(2, runtime="ray", recovery="local", replicas=replicas)):  # refused before Ray starts
        with pytest.raises(FlowError, match=message.replace("(", r"\(")):
            run()


def test_two_named_steps_of_one_stage_need_one_r():
    f = Flow("one-stage")
    f.source(MemorySource([1]), name="src").key_by(str).count(name="a").map(str, name="b").sink(MemorySink("o"))
    with pytest.raises(FlowError, match="replicas names steps 'a' \\(r=2\\) and 'b' \\(r=3\\) of one stage: .*give both the same r"):
        _local(replicas={"a": 2, "b": 3}).replicated(f.plan(2))
    assert len(_local(replicas={"a": 2, "b": 2}).replicated(f.plan(2))) == 2


@pytest.mark.parametrize("replicas, message", [
    ({"sums": 0}, r"replicas\['sums'\] is an int >= 1"),
    ({"sums": 2.0}, r"replicas\['sums'\] is an int >= 1"),
    ({}, "names no step"),
    ("2", "replicas is an int >= 1 .* or a mapping"),
])
def test_run_config_refuses_replica_values_it_cannot_have(replicas, message):
    with pytest.raises(FlowError, match=message):
        _local(replicas=replicas)


def test_a_named_stage_needs_local_recovery_and_majority_needs_two():
    with pytest.raises(FlowError, match="set recovery='local'"):
        RunConfig(replicas={"sums": 2})
    with pytest.raises(FlowError, match="verify='majority' needs replicas >= 2"):
        _local(replicas={"sums": 1}, verify="majority")


def test_majority_refuses_a_sink_without_replicas_that_a_voted_stage_feeds():
    """The gate holds the replicas' sink bundles only: the counts stage's sink would write what a
    corrupt "sums" primary sent before the vote found it (seen in the simulator once a vote's
    epoch ran long; on Ray only replicas have a gate too). Refused, in the simulator and on Ray
    alike (``RunConfig.replicated``), before a run starts."""
    with pytest.raises(FlowError, match="sink 'o' is in a stage without replicas that step 'sums' feeds.*one of counts"):
        Simulation(two_keyed().plan(2), _local(replicas={"sums": 3}, verify="majority"))
    with pytest.raises(FlowError, match="sink 'o' is in a stage without replicas"):
        _local(replicas={"sums": 3}, verify="majority").replicated(two_keyed().plan(3))
    with pytest.raises(FlowError, match="sink 'o' is in a stage without replicas"):  # on Ray: before anything starts
        two_keyed().run(2, runtime="ray", guarantee="exactly-once", recovery="local", replicas={"sums": 3}, verify="majority")
    # the sink's stage voted (the sums unreplicated, upstream), or sample:N's unverified output: taken
    assert _local(replicas={"counts": 3}, verify="majority").replicated(two_keyed().plan(2))
    assert _local(replicas={"sums": 3}, verify="sample:2").replicated(two_keyed().plan(2))


@pytest.mark.parametrize("verify, replicas", [("first", {"sums": 2}), ("majority", {"counts": 3}), ("sample:2", {"sums": 2}),
                                              ("majority", {"sums": 3, "counts": 2}), ("first", {"sums": 2, "counts": 3})],
                         ids=["first", "majority", "sample", "majority-3-and-2", "first-2-and-3"])
def test_deaths_and_flips_of_the_named_stages_replicas_give_the_failure_free_output(verify, replicas):
    """Two replicas die a run (primaries among them), under majority / sample:2 one flips."""
    flow = two_keyed()
    named = {stage_of(flow.plan(2), step): r for step, r in replicas.items()}
    expected = sorted(Simulation(flow.plan(2), _local(seed=0, snapshot_interval=0.004)).run().output("o"))
    flips = 0 if verify == "first" else 1
    wrong, failures, flipped = [], 0, 0
    for seed in range(SEEDS):
        config = _local(seed=seed, snapshot_interval=(3, 6)[seed % 2] / 1000, replicas=replicas, verify=verify)
        sim = Simulation(flow.plan(2 + seed % 2), config, replica_crashes=2, replica_flips=flips)
        # only the named stage's instances have replicas
        assert sim.replicas.replicated == {k: named[k.stage] for k in sim.plan.instances if k.stage in named}
        step_to_end(sim, f"seed {seed}", lambda: f"replica failures {sim.replicas.failures}")
        result = sim.run()
        # a restore only where a vote rolled the run back (a flip its replicas could not outvote)
        rolled_back = sim.votes is not None and any(d.action.startswith("rolled back") for d in sim.votes.dissents)
        if sorted(result.output("o")) != expected or sim.restores and not rolled_back:
            wrong.append((seed, sim.replicas.failures, sim.restores))
        failures += len(sim.replicas.failures)
        flipped += 0 if sim.votes is None else len(sim.votes.flips)
        assert {k.stage for k in sim.replicas.sets} == set(named) and all(len(incs) == named[k.stage] for k, incs in sim.replicas.sets.items())
    assert not wrong, f"seeds whose output differs or that restored an instance without a vote's rollback: {wrong[:5]}"
    assert failures > SEEDS // 2 and (flips == 0 or flipped > SEEDS // 2), (failures, flipped)
