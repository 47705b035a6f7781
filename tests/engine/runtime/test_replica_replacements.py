"""A replacement replica (replica_replacements.py): under verify="majority" a dead replica is
replaced by one restored from the newest certified snapshot and caught up from its senders'
logs; the instance is back to its replicas, the replacement catches up and then votes, and the
output is the failure-free one. Under verify="first" from the newest committed snapshot: a
replacement caught up can be promoted when the primary dies later."""

from __future__ import annotations

from driftstream.engine.model.config import RunConfig
from driftstream.engine.runtime.simulator import Simulation

from tests.engine.runtime.test_local_recovery import DATA, step_to_end
from tests.pipelines import STATE_REKEY_STATE, build
from tests.reference import reference_outputs

FLOW = build("replacements", DATA, STATE_REKEY_STATE, partitions=3)


def _config(seed: int, replicas: int = 3, verify: str = "majority") -> RunConfig:
    return RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                     replicas=replicas, verify=verify)


def _check_replaced(sim: Simulation, seed: int, replicas: int = 3) -> None:
    replacements = sim.replicas.replacements
    step_to_end(sim, f"seed {seed}", lambda: f"catching up {replacements.catching_up}")
    assert sim.run().output("out") == reference_outputs(FLOW)["out"], seed
    dead = [inc for _, inc, _ in sim.replicas.failures]
    assert len(replacements.started) == len(dead) and not replacements.catching_up, seed
    assert all(len(incs) == replicas and not set(incs) & set(dead) for incs in sim.replicas.sets.values()), seed
    assert sim.restores == {}, seed  # no instance rolled back
    if sim.votes is not None:  # each replacement that lived to the end voted on the last epoch, as the others
        live = [inc for _, inc, _ in replacements.started if inc in sim.replicas.hosts]
        assert all(sim.votes.digests[inc].covers(len(sim.votes.epochs.boundaries)) for inc in live), seed


def test_seeded_deaths_are_replaced_caught_up_and_vote():
    for seed in range(20):
        _check_replaced(Simulation(FLOW.plan(2 + seed % 2), _config(seed), replica_crashes=3, acker_shards=seed % 3), seed)


def test_a_replica_killed_after_a_certified_snapshot_is_restored_from_it():
    """The hook kills a chosen replica (the primary, or another) once a snapshot is certified:
    its replacement restores that snapshot and has the rest re-sent from the senders' logs."""
    restored = 0
    for seed in range(12):
        sim = Simulation(FLOW.plan(2 + seed % 2), _config(seed), acker_shards=seed % 3)
        while sim.votes.rollback_target()[1] is None and sim.step():
            pass
        instance = sorted(sim.replicas.sets)[seed % len(sim.replicas.sets)]
        action = sim.replica_faults.kill(instance, sim.replicas.sets[instance][seed % 3])
        assert action.startswith("killed; replaced by replica"), action
        restored += "snapshot" in action
        _check_replaced(sim, seed)
    assert restored >= 8, restored


def test_under_first_seeded_deaths_are_replaced_and_the_replacements_take_over():
    """verify="first", r = 2: each dead replica is replaced from the newest committed snapshot;
    an instance loses another only once its replacement caught up, so later deaths strike
    replacements too, and a primary's death promotes one (20 seeds: 94 deaths, 6 of them
    replacements, 4 replacements promoted)."""
    struck = promoted = 0
    for seed in range(20):
        sim = Simulation(FLOW.plan(2 + seed % 2), _config(seed, 2, "first"), replica_crashes=6, acker_shards=seed % 3)
        _check_replaced(sim, seed, replicas=2)
        started = {inc for _, inc, _ in sim.replicas.replacements.started}
        struck += sum(inc in started for _, inc, _ in sim.replicas.failures)
        promoted += sum(primary and inc in started for _, inc, primary in sim.replicas.failures)
        promoted += sum(incs[0] in started for incs in sim.replicas.sets.values())
    assert struck >= 3 and promoted >= 2, (struck, promoted)
