"""Naming and numbering the replicas of a run (control/replica_launch.py), without Ray."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.control.replica_launch import Replica, ReplicaLaunch, replica_name
from driftstream.engine.model.config import RunConfig
from driftstream.engine.testing import MemorySink, MemorySource


def _plan():
    flow = Flow("rl")
    flow.source(MemorySource(range(4), partitions=2), name="src").key_by(lambda x: x % 2, name="k").stateful_map(
        lambda s, x: ((s or 0) + x, x), name="sum").sink(MemorySink("o"))
    return flow.plan(2)


def test_every_instance_that_reads_no_source_gets_fresh_incarnations():
    plan = _plan()
    incarnations = {k: n for n, k in enumerate(plan.instances)}
    sets, after = ReplicaLaunch(RunConfig(replicas=3, recovery="local")).number(plan, incarnations, len(incarnations))
    assert set(sets) == set(plan.instances) - set(plan.source_instances)
    assert all(incs[0] == incarnations[k] and len(incs) == 3 for k, incs in sets.items())
    named, _ = ReplicaLaunch(RunConfig(replicas={"sum": 2}, recovery="local")).number(plan, incarnations, len(incarnations))
    assert {k: len(incs) for k, incs in named.items()} == {k: 2 for k in sets}  # the stage holding "sum": its own r
    numbers = [inc for incs in sets.values() for inc in incs[1:]]
    assert sorted(numbers) == list(range(len(incarnations), after))


def test_a_relaunch_resets_a_surviving_replica_and_names_a_new_one_afresh():
    launch = ReplicaLaunch(RunConfig(replicas=2, recovery="local"))
    first = launch._fresh_name("rl/sum/0", {})
    assert first == replica_name("rl/sum/0", 1)
    launch.sets = {}
    assert launch._fresh_name("rl/sum/1", {"rl/sum/1/replica-1": None}) == "rl/sum/1/replica-1"
    launch.sets = {(1, 0): [Replica(0, "rl/sum/0", None)]}
    assert launch._fresh_name("rl/sum/0", {}) == replica_name("rl/sum/0", 2)  # replica-1 may be the promoted primary


def test_a_rescale_keeps_the_replicas_of_the_instances_the_new_plan_has_as_many_as_it_replicates():
    """kept_by: the secondaries a rescale's relaunch resets in place (each restores its instance's
    part again); those of an instance the new plan lacks go, and so do all at a parallelism where
    the stage has no replicas."""
    plan = _plan()
    launch = ReplicaLaunch(RunConfig(replicas=3, recovery="local"))
    launch.sets = {k: [Replica(0, plan.actor_name(k), None)] + [Replica(n, replica_name(plan.actor_name(k), n), None) for n in (1, 2)]
                   for k in plan.instances if k not in plan.source_instances}
    assert launch.kept_by(plan.with_parallelism(3)) == {replica_name(f"rl/k/{i}", n) for i in (0, 1) for n in (1, 2)}
    assert launch.kept_by(plan.with_parallelism(1)) == set()  # fused at 1: its one stage reads a source, no replicas
    fewer = ReplicaLaunch(RunConfig(replicas={"sum": 2}, recovery="local"))
    fewer.sets = launch.sets
    assert fewer.kept_by(plan) == {replica_name(f"rl/k/{i}", 1) for i in (0, 1)}  # one each: r = 2
