"""verify="majority" on the simulator (issue 58, items 1 and 4; simulated_votes.py): the
replicas vote per snapshot interval on digests of what their sinks released and of their state;
the sinks take an epoch once every instance agreed. Over hundreds of seeds of the keyed flows
the replicas' tests use, with values flipped in a replica's state and replicas killed at any
step, every output is the fault-free one, every flip is found and its replica named, and each
instance is back to its replicas; with two replicas a mismatch rolls back; a step that draws at
random is reported as likely non-determinism, by name. A flip of a window's open state is caught
too. Under verify="sample:N" (no gate, one epoch in N voted after its output left) every dissent
names a flipped replica, N = 1 finds what a majority finds, and a corrupt primary's output may
stay in the sinks (Warden's trade-off)."""

from __future__ import annotations

import random

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime import simulated_votes
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.ordering.replica_digests import Vote

from tests.engine.runtime.test_local_recovery import DATA, TIMED_FLOWS, step_to_end
from tests.engine.runtime.test_simulated_replicas import FLOWS
from tests.pipelines import STATE_REKEY_STATE, build
from tests.reference import reference_outputs

#: Seeded runs per flow and check (each ~0.05-0.15 s); the slow tier runs 40 more (more by hand: see the architecture doc).
SEEDS = 30


def _run(flow: Flow, seed: int, replicas: int = 3, flips: int = 2, deaths: int = 2) -> tuple:
    """(simulation, output) of one seeded run at parallelism 2 or 3, through 0-2 acker shards."""
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                       replicas=replicas, verify="majority")
    sim = Simulation(flow.plan(2 + seed % 2), config, replica_crashes=deaths, replica_flips=flips, acker_shards=seed % 3)
    step_to_end(sim, f"seed {seed}", lambda: f"flips {sim.votes.flips}, dissents {sim.votes.dissents}")
    return sim, sim.run().output("out")


def _wrong(sim: Simulation) -> list:
    """What a run did wrong beside its output: a flip never found (a vote named its replica, or
    a rollback or its death undid it first), a dissent naming no flipped replica, a dissenter
    not replaced or rolled back, an instance short of its replicas at the end."""
    votes, wrong = sim.votes, []
    flipped = {f.incarnation for f in votes.flips}
    wrong += [("flip not found", f) for f in votes.flips if not f.found]
    wrong += [("dissent naming no flipped replica", d) for d in votes.dissents if not set(d.replicas) & flipped]
    wrong += [("dissenter kept", d) for d in votes.dissents if not d.action.startswith(("removed; replaced", "rolled back"))]
    wrong += [("short of replicas", i, incs) for i, incs in sim.replicas.sets.items() if len(incs) != sim.config.replicas]
    return wrong


def _check_seeds(ops: list, seeds: range, **faults) -> dict:
    flow = build("votes", DATA, ops, partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, seen = [], {"detected": 0, "replaced": 0, "rolled back": 0, "deaths": 0}
    for seed in seeds:
        sim, output = _run(flow, seed, **faults)
        if output != expected or _wrong(sim):
            wrong.append((seed, output == expected, _wrong(sim)[:2]))
        seen["detected"] += sum(f.found == "detected" for f in sim.votes.flips)
        seen["replaced"] += sum("replaced" in d.action for d in sim.votes.dissents)
        seen["rolled back"] += len(sim.votes.rollbacks)
        seen["deaths"] += len(sim.replicas.failures)
    assert not wrong, f"seeds that went wrong (seed, output right, what): {wrong[:3]}"
    return seen


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_flips_and_deaths_under_a_majority_give_the_fault_free_output_and_name_the_flipped(name):
    seen = _check_seeds(FLOWS[name], range(SEEDS))
    # The seeds reached what they test: flips found by a vote, dissenters replaced and rolled back, deaths.
    assert seen["detected"] >= SEEDS // 5 and seen["deaths"] >= SEEDS, seen


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_a_global_rollback_beside_votes_restores_the_certified_snapshot_and_votes_anew(name):
    """Every instance and replica restarted at a seeded step (what a crash that kills an instance's
    last replica does) restores the newest snapshot the votes certified, not the newest committed
    (which may hold a corrupt primary's state), and the votes start again from it: the fault-free
    output. Before, the restart kept the old votes (a KeyError at the next boundary) and restored
    the newest committed snapshot. ``crashes=`` beside voting replicas stays refused until a crash's
    local recovery beside them holds too (see the architecture doc)."""
    flow = build("votes", DATA, FLOWS[name], partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, restarts = [], 0
    for seed in range(SEEDS // 2):
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                           replicas=3, verify="majority")
        sim = Simulation(flow.plan(2 + seed % 2), config, replica_crashes=1, replica_flips=1, acker_shards=seed % 3)
        for _ in range(random.Random(seed).randrange(30, 400)):
            if not sim.step():
                break
        else:
            certified = sim.restore.restart()
            assert certified is None or sim.votes.pinned(certified.snapshot_id)
            sim.restart_all(certified, "a seeded restart")
            restarts += 1
        step_to_end(sim, f"seed {seed}", lambda: f"flips {sim.votes.flips}, dissents {sim.votes.dissents}")
        if sim.run().output("out") != expected or _wrong(sim):
            wrong.append((seed, _wrong(sim)[:2]))
    assert not wrong, f"seeds that went wrong (seed, what): {wrong[:3]}"
    assert restarts >= SEEDS // 4, restarts


def test_flips_alone_are_outvoted_a_corrupt_secondary_replaced_and_a_corrupt_primary_rolled_back():
    seen = _check_seeds(STATE_REKEY_STATE, range(SEEDS), deaths=0)
    assert seen["replaced"] >= 3 and seen["rolled back"] >= 3 and seen["detected"] >= SEEDS // 4, seen


def test_with_two_replicas_a_flip_is_a_mismatch_rolled_back_to_a_snapshot_both_agreed_on():
    seen = _check_seeds(STATE_REKEY_STATE, range(SEEDS), replicas=2, deaths=0)
    assert seen["rolled back"] >= SEEDS // 5 and seen["detected"] == seen["rolled back"], seen


@pytest.mark.slow  # 20 more seeds of each: ~4 s (the suite is kept under 20 minutes; 120 more passed by hand)
@pytest.mark.parametrize("name, faults", [("state-rekey-state", {}), ("entries", {}), ("state-rekey-state", {"replicas": 2})])
def test_more_seeded_flips_give_the_fault_free_output(name, faults):
    _check_seeds(FLOWS[name], range(SEEDS, SEEDS + 20), **faults)


@pytest.mark.parametrize("voting", [True, False])
def test_flips_reach_the_output_unless_the_vote_holds_it(voting):
    """A longer run (running sums of 200 elements: most flips come before a key's last element):
    with the vote every seed's output is the fault-free one; with every vote passing (the gate
    open), most seeds' is not: what the checks above pass on is the vote."""
    flow = _counter_flow(200)
    expected = reference_outputs(flow)["out"]
    with pytest.MonkeyPatch.context() as mp:
        if not voting:
            mp.setattr(simulated_votes, "vote", lambda digests: Vote(None, sorted(digests), []))
        differ = sum(_run(flow, seed, deaths=0)[1] != expected for seed in range(20))
    assert differ == 0 if voting else differ >= 10, differ


def _counter_flow(n: int = 60, draw: str = "") -> Flow:
    """A running sum per key; ``draw``: an undeclared ``random.random()`` map instead, whose
    draws its stage's sink releases ("sink") or sends on to a keyed running sum ("send")."""
    f = Flow("votes-doc")
    s = f.source(MemorySource(range(n), partitions=2)).key_by(lambda x: x % 3)
    if draw == "sink":
        s.map(lambda x: (x, random.random())).sink(MemorySink("out"))
        return f
    if draw == "send":
        s.map(lambda x: (x, random.random())).key_by(lambda p: p[0] % 2).stateful_map(lambda s, p: ((s or 0) + p[0],) * 2).sink(MemorySink("out"))
        return f
    s.stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("out"))
    return f


def _flip_when_settled(sim: Simulation, which: int) -> simulated_votes.Flip:
    """Step until replica ``which`` (0: the primary) of the first keyed instance has a settled
    value to flip, and flip it (the test's hook)."""
    instance = min(sim.replicas.sets)
    for _ in range(5_000):
        inc = sim.replicas.sets[instance][which]
        flip = sim.votes.flip(inc, random.Random(0))
        if flip is not None:
            return flip
        assert sim.step()
    raise AssertionError("nothing settled to flip")


@pytest.mark.parametrize("which, action", [(1, "removed; replaced by replica"), (0, "rolled back to")])
def test_a_flip_through_the_hook_is_named_in_the_dissent_and_acted_on(which, action):
    flow = _counter_flow()
    expected = reference_outputs(flow)["out"]
    sim, _ = Simulation(flow.plan(2), RunConfig(seed=1, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=3,
                                                verify="majority")), None
    flip = _flip_when_settled(sim, which)
    step_to_end(sim, "hook", lambda: str(sim.votes.dissents))
    result = sim.run()
    assert result.output("out") == expected
    (dissent,) = sim.votes.dissents
    (shown,) = result.metrics.dissents
    assert shown["instance"] == f"{flip.instance.stage}/{flip.instance.index}" and shown["replicas"] == [flip.incarnation]
    assert shown["kind"] == "corruption" and shown["t_range"] == dissent.t_range and shown["action"] == dissent.action
    assert dissent.replicas == [flip.incarnation] and dissent.instance == flip.instance and dissent.kind == "corruption"
    assert dissent.action.startswith(action) and flip.found == "detected" and len(set(dissent.digests.values())) == 2
    assert flip.incarnation not in sim.replicas.hosts and all(len(incs) == 3 for incs in sim.replicas.sets.values())


@pytest.mark.parametrize("replicas, draw", [(2, "sink"), (3, "sink"), (3, "send")])
def test_an_undeclared_draw_is_reported_as_likely_non_determinism_with_its_step(replicas, draw):
    """Each replica draws its own: the vote finds no majority, rolls back once per instance to
    re-check, and then reports it, naming the map (seen in what its sink released, or in the
    net of what it sent on)."""
    flow = _counter_flow(draw=draw)
    config = RunConfig(seed=2, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=replicas, verify="majority")
    sim = Simulation(flow.plan(2), config)
    step_to_end(sim, "draw", lambda: str(sim.votes.dissents))
    sim.run()
    kinds = {d.kind for d in sim.votes.dissents}
    assert "likely non-determinism" in kinds and "corruption" not in kinds and not sim.votes.flips, kinds
    reported = [d for d in sim.votes.dissents if d.kind == "likely non-determinism"]
    assert all("map" in d.steps and d.instance.stage == 1 for d in reported), reported
    # One rollback per instance to re-check, then the primary's output unverified.
    assert len(sim.votes.rollbacks) <= len(sim.replicas.sets) and sim.votes.unverified


def test_without_faults_the_replicas_agree_on_every_epoch():
    flow = build("votes", DATA, STATE_REKEY_STATE, partitions=3)
    expected = reference_outputs(flow)["out"]
    for seed in range(10):
        sim, output = _run(flow, seed, flips=0, deaths=0)
        assert output == expected and not sim.votes.dissents and sim.votes.frontier() > len(sim.votes.epochs.boundaries)


def test_flips_need_a_vote():
    config = RunConfig(seed=0, guarantee="exactly-once", recovery="local", replicas=2)
    with pytest.raises(FlowError, match="replica_flips need verify='majority'"):
        Simulation(_counter_flow().plan(2), config, replica_flips=1)


# -- window state in the state digest -------------------------------------------------------------

#: Seeded runs per window flow (each ~0.13 s); the slow tier runs 16 more.
WINDOW_SEEDS = 8


def _check_window_flips(name: str, seeds: range) -> dict:
    """Flips of a window's open state (a pane's, a session's, a tumbling window's fold) under a
    majority of 3: caught at the epoch's end by the state digest, before the window closes."""
    flow, sinks = TIMED_FLOWS[name]()
    expected = reference_outputs(flow)
    wrong, seen = [], {"window flips": 0, "detected": 0}
    for seed in seeds:
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                           replicas=3, verify="majority")
        sim = Simulation(flow.plan(2 + seed % 2), config, replica_flips=2, acker_shards=seed % 3)
        step_to_end(sim, f"seed {seed}", lambda: f"flips {sim.votes.flips}, dissents {sim.votes.dissents}")
        result, flipped = sim.run(), {f.incarnation for f in sim.votes.flips}
        if any(result.output(s) != expected[s] for s in sinks) or any(not set(d.replicas) & flipped for d in sim.votes.dissents):
            wrong.append(seed)
        seen["window flips"] += sum(f.step == "window" for f in sim.votes.flips)
        seen["detected"] += sum(f.step == "window" and f.found == "detected" for f in sim.votes.flips)
    assert not wrong, f"seeds whose output differs or whose dissent names no flipped replica: {wrong}"
    return seen


@pytest.mark.parametrize("name", ["tumbling", "sliding panes", "session"])
def test_flips_of_window_state_are_caught_and_give_the_fault_free_output(name):
    """Without the windows in the digest, a flip in a window still open passes the epoch's vote,
    which certifies the snapshot holding it; a rollback there makes every replica agree on the
    wrong result (12, 20 and 20 of 30 seeds differed)."""
    seen = _check_window_flips(name, range(WINDOW_SEEDS))
    assert seen["detected"] >= WINDOW_SEEDS, seen


@pytest.mark.slow  # 8 more seeds of each: ~3.5 s (16 passed by hand)
@pytest.mark.parametrize("name", ["tumbling", "sliding panes", "session", "window join"])
def test_more_seeded_flips_of_window_state(name):
    _check_window_flips(name, range(WINDOW_SEEDS, WINDOW_SEEDS + 8))


# -- verify="sample:N" ----------------------------------------------------------------------------

def _sampled(flow: Flow, seed: int, verify: str, replicas: int = 3, deaths: int = 0, flips: int = 2) -> tuple:
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local",
                       replicas=replicas, verify=verify)
    sim = Simulation(flow.plan(2 + seed % 2), config, replica_crashes=deaths, replica_flips=flips, acker_shards=seed % 3)
    step_to_end(sim, f"seed {seed}", lambda: f"flips {sim.votes.flips}, dissents {sim.votes.dissents}")
    return sim, sim.run().output("out")


def test_sample_1_finds_every_flip_a_majority_finds():
    """With N = 1 every epoch is voted, after its output left instead of before: the same seeds
    (the gate draws nothing from the scheduler) see the same flips found, the same dissents and
    actions, and the output of a majority's run wherever no flip struck a primary."""
    flow = build("votes", DATA, STATE_REKEY_STATE, partitions=3)
    found = 0
    for seed in range(10):
        runs = [_sampled(flow, seed, verify, deaths=2) for verify in ("majority", "sample:1")]
        (gated, gated_out), (sampled, sampled_out) = runs
        assert [(f.incarnation, f.key, f.found) for f in sampled.votes.flips] == [(f.incarnation, f.key, f.found) for f in gated.votes.flips], seed
        assert [(d.replicas, d.epoch, d.kind, d.action) for d in sampled.votes.dissents] == [
            (d.replicas, d.epoch, d.kind, d.action) for d in gated.votes.dissents], seed
        assert all(d.released for d in sampled.votes.dissents) and not any(d.released for d in gated.votes.dissents)
        assert sampled_out == gated_out or any(f.primary for f in sampled.votes.flips), seed
        found += sum(f.found == "detected" for f in sampled.votes.flips)
    assert found >= 5, found


@pytest.mark.parametrize("verify, replicas", [("sample:2", 3), ("sample:3", 2)])
def test_sample_n_names_only_flipped_replicas_and_acts_on_them(verify, replicas):
    """Every dissent names a flipped replica and is acted on; with the flips on secondaries the
    output is the fault-free one (the primary's went out unchecked, and was right)."""
    flow = build("votes", DATA, STATE_REKEY_STATE, partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, detected = [], 0
    for seed in range(SAMPLE_SEEDS):
        sim, output = _sampled(flow, seed, verify, replicas)
        votes = sim.votes
        flipped = {f.incarnation for f in votes.flips}
        if (any(not set(d.replicas) & flipped or not d.released for d in votes.dissents)
                or any(not d.action.startswith(("removed; replaced", "rolled back")) for d in votes.dissents)
                or (output != expected and not any(f.primary for f in votes.flips))):
            wrong.append(seed)
        detected += sum(f.found == "detected" for f in votes.flips)
    assert not wrong, f"seeds that went wrong: {wrong}"
    assert detected >= SAMPLE_SEEDS // 2, detected


def test_a_promoted_primary_votes_only_past_what_the_dead_one_wrote():
    """Without a gate the sinks may hold what a dead primary wrote ahead of its successor, whose
    sinks then drop it while the replacements release it: its digest differed, a dissent without
    a flip (seed 49). Replica deaths and flips, the fan-out flow (~0.04 s a run)."""
    flow = build("votes", DATA, FLOWS["fan-state"], partitions=3)
    for seed in range(30, 60):
        sim, _ = _sampled(flow, seed, "sample:2", deaths=2)
        flipped = {f.incarnation for f in sim.votes.flips}
        assert all(set(d.replicas) & flipped for d in sim.votes.dissents), (seed, sim.votes.dissents)
        assert all(len(incs) == 3 for incs in sim.replicas.sets.values()), seed


def test_sample_n_votes_one_epoch_in_n_and_digests_the_state_of_those_alone():
    """Fault-free running sums of 200 elements: each instance votes the epochs k % N == 0 of its
    last + 1 (one in N, the first included), the others pass unvoted, and the replicas digest
    their state only at the end of a voted one (fewer digests as N grows)."""
    flow = _counter_flow(200)
    expected = reference_outputs(flow)["out"]
    for seed in range(2):
        digests = {}
        for n in (1, 2, 4):
            calls = []
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(simulated_votes, "host_state_digest", lambda host, d=simulated_votes.host_state_digest: calls.append(1) or d(host))
                sim, output = _sampled(flow, seed, f"sample:{n}", flips=0)
            last, instances = len(sim.votes.epochs.boundaries), len(sim.replicas.sets)
            voted = len(range(0, last + 1, n))
            assert output == expected and not sim.votes.dissents
            assert sim.votes.tally == {"voted": voted * instances, "unvoted": (last + 1 - voted) * instances}, (n, last, sim.votes.tally)
            digests[n] = len(calls)
        assert digests[1] > digests[2] > digests[4] > 0, digests


#: Seeded runs per sample:N check (each ~0.1 s); the slow tier runs 30 more.
SAMPLE_SEEDS = 12


@pytest.mark.slow  # 15 more seeds, with replica deaths: ~3 s (30 passed by hand)
def test_more_seeds_of_sample_n_with_deaths():
    flow = build("votes", DATA, STATE_REKEY_STATE, partitions=3)
    for seed in range(SAMPLE_SEEDS, SAMPLE_SEEDS + 15):
        sim, _ = _sampled(flow, seed, "sample:2", deaths=2)
        flipped = {f.incarnation for f in sim.votes.flips}
        assert all(set(d.replicas) & flipped for d in sim.votes.dissents), seed
        assert all(len(incs) == 3 for incs in sim.replicas.sets.values()), seed


def test_sample_n_lets_a_corrupt_primarys_output_out_where_a_majority_holds_it():
    """Warden's trade-off, stated: under sample:N what a corrupt primary released before the vote
    stays in the sinks (they skip what they hold when the run rolls back); under majority the gate
    held it. Running sums of 200 elements, the same seeds."""
    flow = _counter_flow(200)
    expected = reference_outputs(flow)["out"]
    differ = {verify: [seed for seed in range(10) if _sampled(flow, seed, verify)[1] != expected] for verify in ("majority", "sample:2")}
    assert not differ["majority"] and differ["sample:2"], differ


@pytest.mark.parametrize("options, message", [
    ({"replicas": 1, "verify": "sample:2"}, r"verify='sample:2' needs replicas >= 2"),
    ({"replicas": 3, "verify": "sample:0"}, r"verify='sample:N' takes an int N >= 1"),
    ({"replicas": 3, "verify": "sample:x"}, r"verify='sample:N' takes an int N >= 1"),
])
def test_run_config_refuses_a_sample_it_cannot_take(options, message):
    with pytest.raises(FlowError, match=message):
        RunConfig(recovery="local", **options)
