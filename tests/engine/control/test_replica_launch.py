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
