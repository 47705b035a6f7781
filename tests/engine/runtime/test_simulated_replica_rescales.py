"""Rescaling a run with replicas in the simulator (issue 58; simulated_rescales.py with
simulated_replicas.py): the drained snapshot as any rescale, then every replica of every instance
restarts at the next parallelism from its instance's part. After it the run is a replicated run
as any other: a replica's death fails over without a restore, and under verify="majority" the
votes go on (a rescale waits for its snapshot's epoch to pass: the gate holds its output until
then). Over tens of seeds of the keyed flows the replicas' tests use, rescaled once to three
times with replicas killed and values flipped at any step, every output is the failure-free one."""

from __future__ import annotations

from collections import Counter

import pytest

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.simulator import Simulation

from tests.engine.runtime.test_local_recovery import DATA, step_to_end
from tests.engine.runtime.test_simulated_replicas import FLOWS, _counter_flow
from tests.engine.runtime.test_simulated_votes import _wrong
from tests.pipelines import build
from tests.reference import reference_outputs

#: Seeded runs per flow and check (each ~0.1-0.3 s; under votes, r = 3, ~0.4 s: fewer); the slow tier runs more.
SEEDS, VOTED_SEEDS = 20, 12

#: The parallelisms a seed's run starts at (2 + seed % 2) and moves to, by seed % 4.
RESCALES = ([3, 2], [2, 3], [3], [2, 4, 2])


def _run(ops: list, seed: int, verify: str, replicas: int, deaths: int, flips: int = 0) -> tuple:
    """(simulation, result, per replica's death: the rescales done before it, whether it was a primary) of one seeded run."""
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                       replicas=replicas, verify=verify)
    flow = build("replica-rescales", DATA, ops, partitions=3)
    sim = Simulation(flow.plan(2 + seed % 2), config, rescales=RESCALES[seed % 4], replica_crashes=deaths, replica_flips=flips,
                     acker_shards=seed % 3)
    died_after, fail = [], sim.replicas.fail

    def recorded(instance, inc, batch_size):
        died_after.append((len(sim.rescaling.done), sim.replicas.sets[instance][0] == inc))
        return fail(instance, inc, batch_size)

    sim.replicas.fail = recorded
    step_to_end(sim, f"seed {seed}", lambda: f"rescales {sim.rescaling.done}, phase {sim.rescaling.phase}, failures {sim.replicas.failures}")
    return sim, sim.run(), died_after


def _check_seeds(ops: list, seeds: range, verify: str, replicas: int, deaths: int, flips: int = 0) -> dict:
    expected = reference_outputs(build("replica-rescales", DATA, ops, partitions=3))["out"]
    wrong, seen = [], {"rescales": 0, "deaths after a rescale": 0, "failovers after a rescale": 0, "detected": 0}
    for seed in seeds:
        sim, result, died_after = _run(ops, seed, verify, replicas, deaths, flips)
        final = sim.plan
        whole = set(sim.replicas.sets) == set(sim.config.replicated(final)) and all(len(i) == replicas for i in sim.replicas.sets.values())
        problems = (_wrong(sim) if sim.votes is not None else []) + ([] if whole else [("replica sets", sim.replicas.sets)])
        if result.output("out") != expected or (result.metrics.restores and not flips) or problems:
            wrong.append((seed, result.output("out") == expected, result.metrics.restores, problems[:2]))
        seen["rescales"] += len(sim.rescaling.done)
        seen["deaths after a rescale"] += sum(n > 0 for n, _ in died_after)
        seen["failovers after a rescale"] += sum(n > 0 and primary for n, primary in died_after)
        seen["detected"] += 0 if sim.votes is None else sum(f.found == "detected" for f in sim.votes.flips)
    assert not wrong, f"seeds that went wrong (seed, output right, restores, what): {wrong[:3]}"
    return seen


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_rescaled_replicas_under_first_give_the_failure_free_output_and_fail_over_without_a_restore(name):
    seen = _check_seeds(FLOWS[name], range(SEEDS), "first", replicas=2, deaths=4)
    # The seeds reached what they test: rescales, replicas killed after one, primaries among them.
    assert seen["rescales"] >= SEEDS and seen["deaths after a rescale"] >= SEEDS // 2 and seen["failovers after a rescale"] >= SEEDS // 4, seen


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_rescaled_replicas_under_a_majority_vote_on_and_give_the_fault_free_output(name):
    """r = 3, two replica deaths and two value flips a run: every flip is found (a vote named its
    replica, or a rollback or its death undid it), after a rescale too."""
    seen = _check_seeds(FLOWS[name], range(VOTED_SEEDS), "majority", replicas=3, deaths=2, flips=2)
    n = VOTED_SEEDS
    assert seen["rescales"] >= n and seen["deaths after a rescale"] >= n // 2 and seen["detected"] >= n // 2, seen


def test_rescaled_pairs_under_a_majority_fail_over_without_a_restore():
    seen = _check_seeds(FLOWS["state-rekey-state"], range(SEEDS), "majority", replicas=2, deaths=4)
    assert seen["rescales"] >= SEEDS and seen["failovers after a rescale"] >= SEEDS // 4, seen


@pytest.mark.slow  # 8 more seeds of each flow, r = 3 under votes: ~8 s (more by hand: see the architecture doc)
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_more_seeded_rescales_of_voting_replicas(name):
    _check_seeds(FLOWS[name], range(VOTED_SEEDS, VOTED_SEEDS + 8), "majority", replicas=3, deaths=2, flips=2)


#: Seeded runs per flow of crashes and rescales in one run (each ~0.1-0.3 s).
CRASH_SEEDS = 12


@pytest.mark.parametrize("verify, replicas, flips", [("first", 2, 0), ("majority", 3, 1)], ids=["first", "majority"])
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_crashes_and_rescales_in_one_run_give_the_failure_free_output(name, verify, replicas, flips):
    """Two crashes (a local recovery, or a global rollback when a replicated instance dies whole or
    a rescale is under way), one to three rescales and a replica's death a run; under a majority
    (r = 3) a flipped value too: the failure-free output (refused before; by hand 990 runs under
    "first", 900 under "majority", 0 wrong). Under a majority a crash's local recovery restores
    the newest certified snapshot, as a global rollback does: a newer one, committed here before
    its vote, held a flipped primary's state, or after a rollback past it a time the run had not
    reached again (2 of 150 went wrong so)."""
    flow = build("replica-rescales", DATA, FLOWS[name], partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, crashed, rescaled = [], 0, 0
    for seed in range(CRASH_SEEDS):
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                           replicas=replicas, verify=verify)
        sim = Simulation(flow.plan(2 + seed % 2), config, crashes=2, rescales=RESCALES[seed % 4], replica_crashes=1, replica_flips=flips,
                         acker_shards=seed % 3)
        step_to_end(sim, f"seed {seed}", lambda: f"rescales {sim.rescaling.done}, crash points {sim.crash_points}")
        if sim.run().output("out") != expected:
            wrong.append((seed, sim.crash_points, sim.fallback_reasons, sim.rescaling.done))
        crashed += len(sim.crash_points)
        rescaled += len(sim.rescaling.done)
    assert not wrong, f"seeds that went wrong (seed, crash points, fallbacks, rescales): {wrong[:3]}"
    assert crashed >= CRASH_SEEDS and rescaled >= CRASH_SEEDS // 2, (crashed, rescaled)


#: Seeded runs per flow under each sampled vote (each ~0.1-0.2 s).
SAMPLED_SEEDS = 10


@pytest.mark.parametrize("verify, r", [("sample:2", 3), ("sample:3", 2)])
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_rescaled_replicas_under_sampled_votes_restart_from_a_certified_snapshot(name, verify, r):
    """Refused before: under "sample:N" a rescale's snapshot could end an epoch no vote took, so a
    value flipped in a primary went through the restart into every replica, agreed on from then
    on. A rescale now waits for a boundary whose epoch is voted (on Ray its snapshot takes a
    sampled id: each restart's epoch is checked). Two replica deaths and two flips a run; the output is the failure-free one unless
    a flipped replica was the primary at some point (its output left before its vote: sample:N's
    trade-off), and every dissent names a flipped replica. By hand: 1,050 runs (sample:2 with
    r = 3, sample:3 with r = 2, the three flows; two crashes too in 300 of them), 0 wrong."""
    flow = build("replica-rescales", DATA, FLOWS[name], partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, seen = [], Counter()
    for seed in range(SAMPLED_SEEDS):
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                           replicas=r, verify=verify)
        sim = Simulation(flow.plan(2 + seed % 2), config, rescales=RESCALES[seed % 4], replica_crashes=2, replica_flips=2,
                         acker_shards=seed % 3)
        primaries, voted = _primaries_over_the_run(sim), _whether_each_restart_was_voted(sim)
        step_to_end(sim, f"seed {seed}", lambda: f"rescales {sim.rescaling.done}, phase {sim.rescaling.phase}")
        output, votes = sim.run().output("out"), sim.votes
        flipped = {f.incarnation for f in votes.flips}
        led = bool(flipped & primaries)
        whole = all(len(incs) == r for incs in sim.replicas.sets.values())
        if (output != expected and not led) or any(not set(d.replicas) & flipped for d in votes.dissents) or not whole \
                or not all(voted):
            wrong.append((seed, output == expected, led, voted, [(d.kind, d.replicas, d.action) for d in votes.dissents]))
        seen["rescales"] += len(sim.rescaling.done)
        seen["flips"] += len(votes.flips)
    assert not wrong, f"seeds that went wrong (seed, output right, a flipped primary, rescales, dissents): {wrong[:3]}"
    assert seen["rescales"] >= SAMPLED_SEEDS // 2 and seen["flips"] >= SAMPLED_SEEDS, seen  # the seeds did what they test


def _whether_each_restart_was_voted(sim: Simulation) -> list:
    """Per rescale of ``sim`` from now: whether the epoch that ends at its snapshot is one the votes
    take (filled as it restarts). An unvoted one passes a corrupt primary's state to every replica."""
    voted: list = []
    rescaled = sim.votes.rescaled

    def restarted(plan, t, snapshot_id) -> None:
        voted.append(sim.votes.epochs.sampled(sim.votes.epochs.boundaries.index(t)))
        rescaled(plan, t, snapshot_id)

    sim.votes.rescaled = restarted
    return voted


def _primaries_over_the_run(sim: Simulation) -> set:
    """The incarnations that are a primary after any step of ``sim`` from now (filled as it steps)."""
    seen: set = set()
    step = sim.step

    def stepped() -> bool:
        more = step()
        seen.update(incs[0] for incs in sim.replicas.sets.values())
        return more

    sim.step = stepped
    return seen


@pytest.mark.parametrize("options, rescales, message", [
    ({"replicas": 2}, [1], "would leave it without replicas"),  # fused at 1: its stage reads the source
])
def test_what_a_rescale_of_replicas_cannot_do_is_refused_before_the_run(options, rescales, message):
    config = RunConfig(seed=0, guarantee="exactly-once", recovery="local", **options)
    with pytest.raises(FlowError, match=message):
        Simulation(_counter_flow().plan(2), config, rescales=rescales)
