"""recovery="local" on the simulator (issue 58): a crash fails one seeded instance, which
alone restores the newest committed snapshot and has its inputs re-sent from its senders'
logs; its receivers cancel what it sent at or above the watermark of the failure. Over
hundreds of seeds of keyed flows (two keyed stages, a filter, a flat_map; parallelism 2 and
3) every output is the failure-free one, only the crashed instances restored, and no other
instance was ever replaced."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Optional

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.protocol import Watermark
from driftstream.engine.runtime.simulator import Simulation, run_simulated
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.engine.windows import Session, Sliding, Tumbling

from tests.engine.api import test_dead_letters, test_joins, test_windows
from tests.engine.runtime.test_simulated_rescale import FLOWS as RESCALE_FLOWS
from tests.pipelines import STATE_REKEY_ENTRIES, STATE_REKEY_STATE, build, inputs, ops
from tests.reference import reference_outputs

DATA = [("abcd"[i % 4], "xyzw"[i % 3] * (1 + i % 3)) for i in range(32)]

#: Seeded runs per flow: each ~0.03-0.05 s; 120 give ~110 crashes, a third of them restoring a
#: committed snapshot (the rest, the beginning), each crash point 15 times or more (thousands
#: were run by hand; the suite's time is kept well under 20 minutes).
SEEDS = 120
#: Seeded runs per flow of the other checks (windows, joins, rescales, acker shards, the
#: weaker guarantees); the slow tier runs 40 more of each.
FEW = 40
#: A run takes ~100-200 steps.
MAX_STEPS = 20_000


def _config(seed: int) -> RunConfig:
    return RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(3, 6, 12)[seed % 3] / 1000, recovery="local")


def step_to_end(sim: Simulation, what: str, why: Callable[[], str]) -> None:
    """Step ``sim`` until nothing is left, failing the test (``what``, ``why()``: what it says)
    after MAX_STEPS: a watermark that stalls while snapshots go on would never end the run."""
    for _ in range(MAX_STEPS):
        if not sim.step():
            return
    sim.close()
    pytest.fail(f"{what}: no end after {MAX_STEPS} steps, watermark {sim.acker.pushed}, {why()}")


def _local_run(flow: Flow, seed: int, sinks: Optional[list] = None) -> tuple:
    """(simulation, output (of ``sinks``: per sink), the instances whose host was replaced) of one
    seeded run with up to three crashes."""
    sim = Simulation(flow.plan(2 + seed % 2), _config(seed), crashes=3)
    first = dict(sim.live.hosts)
    step_to_end(sim, f"seed {seed}", lambda: f"crash points {sim.crash_points}")
    replaced = {key for key, host in first.items() if sim.live.hosts[key] is not host}
    result = sim.run()
    return sim, result.output("out") if sinks is None else {s: result.output(s) for s in sinks}, replaced


@pytest.mark.parametrize("ops", [STATE_REKEY_STATE, STATE_REKEY_ENTRIES, ["fan", "concat"]], ids=["state-rekey-state", "entries", "fan-state"])
def test_local_recovery_gives_the_failure_free_output_and_restores_only_the_crashed(ops):
    _check_seeds(ops, range(SEEDS))


@pytest.mark.slow  # 80 more seeded crashes a flow (~3 s a flow; 300 passed by hand; the suite is kept under 20 minutes)
@pytest.mark.parametrize("ops", [STATE_REKEY_STATE, STATE_REKEY_ENTRIES], ids=["state-rekey-state", "entries"])
def test_more_seeded_local_recoveries_give_the_failure_free_output(ops):
    _check_seeds(ops, range(SEEDS, SEEDS + 80))


def _only_crashed_replaced(sim: Simulation, replaced: set) -> bool:
    """Whether the instances replaced are those that crashed, each restored once per crash
    (all of them after a global fallback: a crash while a replacement caught up)."""
    if sim.fallbacks:
        return replaced == set(sim.plan.instances)
    return replaced == set(sim.local.restores) and sum(sim.local.restores.values()) == len(sim.crash_points) == sum(sim.restores.values())


def _check_seeds(ops: list, seeds: range) -> None:
    """Every seed's output is the failure-free one and only its crashed instances were
    replaced; the seeds reached crashes, restores of committed snapshots, replays, cancels
    and global fallbacks."""
    flow = build("local", DATA, ops, partitions=3)
    expected = reference_outputs(flow)["out"]
    wrong, others_replaced, crashes, from_commits, replayed, cancelled, fallbacks = [], [], 0, 0, 0, 0, 0
    for seed in seeds:
        sim, out, replaced = _local_run(flow, seed)
        if out != expected:
            wrong.append((seed, sim.crash_points))
        if not _only_crashed_replaced(sim, replaced):
            others_replaced.append((seed, replaced, dict(sim.local.restores)))
        fallbacks += sim.fallbacks
        crashes += len(sim.crash_points)
        from_commits += sum(sid is not None for sid in sim.recoveries)
        replayed += sim.local.replayed
        cancelled += sim.local.cancelled
    assert not wrong, f"seeds whose output differs (seed, crash points): {wrong[:5]}"
    assert not others_replaced, f"instances replaced that did not crash (seed, replaced, crashed): {others_replaced[:5]}"
    # The seeds reached what they test: crashes, restores of committed snapshots, logs re-sent,
    # sends cancelled, and (fewer) global fallbacks.
    assert crashes > len(seeds) // 2 and from_commits > crashes // 5 and replayed > crashes and cancelled > crashes, (crashes, from_commits, replayed, cancelled)
    assert 0 < fallbacks < crashes // 4, (fallbacks, crashes)


WINDOW_DATA = [("abc"[i % 3], (i * 7) % 40, "xyz"[i % 2]) for i in range(36)]
JOIN_DATA = [("LR"[(i // 2) % 2], "ab"[i % 2], i % 10) for i in range(36)]
POISON_DATA = [("abc"[i % 3], (i * 5) % 24 - 3) for i in range(36)]

#: Timers (windows' closes, restored as seeds), a join's two inputs, dead letters: 100 seeds each.
TIMED_FLOWS = {
    "tumbling": lambda: (test_windows.build(WINDOW_DATA, Tumbling(0.01), "fold", 0.005, partitions=3), ["out", "late"]),
    "sliding panes": lambda: (test_windows.build(WINDOW_DATA, Sliding(0.02, 0.005), "count", 0.002, partitions=2), ["out", "late"]),
    "session": lambda: (test_windows.build(WINDOW_DATA, Session(0.005), "fold", partitions=2), ["out", "late"]),
    "window join": lambda: (test_joins.build(JOIN_DATA, "join", "outer", Tumbling(0.01), partitions=3), ["out"]),
    "dead letters": lambda: (test_dead_letters.build(POISON_DATA, partitions=3, state="entries"), ["out", "dlq"]),
}


@pytest.mark.parametrize("name", sorted(TIMED_FLOWS))
def test_local_recovery_of_windows_joins_and_dead_letters_gives_the_failure_free_output(name):
    """A replacement restored at T with a window closing at T is told T itself (its timer holds
    the raw frontier there: told only what lies past it, it stalled in 15 seeds in 100)."""
    _check_timed(name, range(FEW))


def _check_timed(name: str, seeds: range) -> None:
    flow, sinks = TIMED_FLOWS[name]()
    expected = reference_outputs(flow)
    wrong, crashes = [], 0
    for seed in seeds:
        sim, outputs, replaced = _local_run(flow, seed, sinks)
        if outputs != {s: expected[s] for s in sinks} or not _only_crashed_replaced(sim, replaced):
            wrong.append((seed, sim.crash_points))
        crashes += len(sim.crash_points)
    assert not wrong, f"seeds whose output differs or that replaced an instance that did not crash: {wrong[:5]}"
    assert crashes > len(seeds)


@settings(max_examples=60, deadline=None)
@given(data=inputs, op_names=ops, parallelism=st.integers(1, 3), crashes=st.integers(1, 3), seed=st.integers(0, 2**32),
       interval=st.sampled_from([0.003, 0.006, 0.012]), shards=st.integers(0, 2))
def test_any_pipeline_input_and_crashes_give_the_failure_free_output(data, op_names, parallelism, crashes, seed, interval, shards):
    """Random pipelines (fan-out, filter, keyed value and entry state, re-keyed) over random
    input, with or without acker shards: whichever instances crash, wherever, the output is
    the sequential reference."""
    flow = build("local-any", data, op_names, partitions=3)
    config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=interval, recovery="local")
    sim = Simulation(flow.plan(parallelism), config, crashes=crashes, acker_shards=shards)
    assert sim.run().output("out") == reference_outputs(flow)["out"], sim.crash_points


@pytest.mark.parametrize("guarantee", ["at-least-once", "at-most-once"])
def test_local_recovery_keeps_the_weaker_guarantees(guarantee):
    """At-least-once: the failure-free output with duplicates (a replacement's barrier does not
    drop what its sink holds); at-most-once: never a duplicate (a local recovery skips nothing)."""
    flow = build("local", DATA, STATE_REKEY_STATE, partitions=3)
    expected = Counter(reference_outputs(flow)["out"])
    duplicated = 0
    for seed in range(FEW):
        config = dataclasses.replace(_config(seed), guarantee=guarantee)
        out = Counter(Simulation(flow.plan(2 + seed % 2), config, crashes=3).run().output("out"))
        if guarantee == "at-least-once":
            assert not expected - out, f"seed {seed} lost {expected - out}"
            duplicated += bool(out - expected)
        else:
            assert out == expected, f"seed {seed}: {out - expected} more, {expected - out} fewer"
    assert guarantee == "at-most-once" or duplicated  # the seeds did replay output a sink held


def _first_seed(flow: Flow, wanted) -> tuple:
    """The first seed (from 0) whose run (parallelism 2, three crashes) has ``wanted(sim)``: (sim, result)."""
    for seed in range(50):
        sim = Simulation(flow.plan(2), _config(seed), crashes=3)
        result = sim.run()
        if wanted(sim):
            return sim, result
    raise AssertionError("no seed of 50 has it")


def test_the_result_counts_restores_per_instance():
    flow = build("local", DATA, STATE_REKEY_STATE, partitions=3)
    sim, result = _first_seed(flow, lambda sim: len(sim.failed) >= 2 and not sim.fallbacks)
    assert result.metrics.restores == {f"{i.stage}/{i.index}": n for i, n in Counter(sim.failed).items()}
    assert sum(result.metrics.restores.values()) == result.metrics.recoveries == len(sim.failed)
    assert len(result.metrics.restores) < len(flow.plan(2).instances)  # a global rollback restores all six


def test_a_crash_while_a_replacement_catches_up_falls_back_to_a_global_rollback():
    flow = build("local", DATA, STATE_REKEY_STATE, partitions=3)
    sim, result = _first_seed(flow, lambda sim: sim.fallbacks)
    assert set(result.metrics.restores) == {f"{i.stage}/{i.index}" for i in flow.plan(2).instances}
    assert result.output("out") == reference_outputs(flow)["out"]


def test_global_recovery_still_restores_every_instance():
    flow = build("global", DATA, STATE_REKEY_STATE, partitions=3)
    config = RunConfig(seed=0, guarantee="exactly-once", snapshot_interval=0.006)
    metrics = Simulation(flow.plan(2), config, crashes=1).run().metrics
    assert metrics.recoveries == 1
    assert metrics.restores == {f"{i.stage}/{i.index}": 1 for i in flow.plan(2).instances}


def test_recovery_is_global_or_local():
    with pytest.raises(FlowError, match="recovery is 'global'.*or 'local'.*not 'sideways'"):
        RunConfig(recovery="sideways")


def test_the_simulator_takes_local_recovery_through_flow_run():
    f = Flow("sim-local")
    f.source(MemorySource(list(range(6)), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
    out = f.run(2, runtime="simulator", seed=3, guarantee="exactly-once", snapshot_interval=0.003, recovery="local").output("o")
    assert out == [0, 1, 2, 4, 6, 9]
    assert run_simulated(f.plan(2), RunConfig(seed=4, guarantee="exactly-once", snapshot_interval=0.003, recovery="local"), crashes=2).output("o") == out


def test_local_resets_in_place_whose_last_writes_land_keep_exactly_once_output():
    """The failed instance reset in place, as Ray resets an actor: its sink writes in progress
    land before its replacement reads its sinks (their callbacks finding it closed)."""
    flow = build("local", DATA, STATE_REKEY_STATE, partitions=3)
    expected = reference_outputs(flow)["out"]
    landed = 0
    for seed in range(300):  # a failed instance with a write in progress is rarer than any: the first lands at seed 91
        sim = Simulation(flow.plan(2 + seed % 2), _config(seed), crashes=3, resets_in_place=True)
        assert sim.run().output("out") == expected, (seed, sim.crash_points)
        landed += sim.landed
        if landed and seed >= FEW:
            break
    assert landed > 0  # some reset did meet a write in progress


@pytest.mark.parametrize("name", ["stateful_map", "session", "dead letters"])
def test_local_recoveries_through_acker_shards_give_the_failure_free_output(name):
    """1-3 acker shards, and rescales: what a shard has in flight when an instance fails must
    not reach the failed instance's replacement (a watermark relayed late told it the
    watermark past its replay) nor the root (a source's bound, come late, overtook its
    replacement's re-read): 5 and 6 seeds in 100 of session windows differed."""
    _check_sharded(name, range(FEW))


def _check_sharded(name: str, seeds: range) -> None:
    flow, sinks = RESCALE_FLOWS[name]()
    expected = reference_outputs(flow)
    wrong = []
    for seed in seeds:
        sim = Simulation(flow.plan(2 + seed % 2), _config(seed), crashes=3, acker_shards=1 + seed % 3, rescales=[[], [3], [1, 2]][seed % 3])
        result = sim.run()
        if any(result.output(s) != expected[s] for s in sinks):
            wrong.append((seed, sim.crash_points))
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("name", ["stateful_map", "MapState", "session"])
def test_rescales_and_local_recoveries_give_the_failure_free_output(name):
    """A rescale restarts every instance as a new incarnation (LocalRecovery.restart_all); its
    snapshot waits while a replacement catches up (the marker would carry the watermark past
    it: 1 to 5 seeds in 100 differed)."""
    _check_rescaled(name, range(FEW))


def _check_rescaled(name: str, seeds: range) -> None:
    flow, sinks = RESCALE_FLOWS[name]()
    expected = reference_outputs(flow)
    wrong, rescaled = [], 0
    for seed in seeds:
        config = _config(seed)
        sim = Simulation(flow.plan(2), config, crashes=1 + seed % 3, rescales=[[3, 1], [1, 2], [2, 3, 1]][seed % 3])
        result = sim.run()
        rescaled += len(sim.rescaling.done)
        if any(result.output(s) != expected[s] for s in sinks):
            wrong.append((seed, sim.crash_points))
    assert not wrong, wrong[:5]
    assert rescaled > len(seeds)


@pytest.mark.slow  # 40 more seeds of each check above (the suite's time is kept under 20 minutes)
@pytest.mark.parametrize("check, names", [(_check_timed, sorted(TIMED_FLOWS)), (_check_sharded, ["stateful_map", "session", "dead letters"]),
                                          (_check_rescaled, ["stateful_map", "MapState", "session"])], ids=["timed", "sharded", "rescaled"])
def test_more_seeds_of_windows_joins_shards_and_rescales(check, names):
    for name in names:
        check(name, range(60, 100))  # the seeds the slow tier ran when the fast one took 60


# -- a frontier per receiver: the others' output does not wait for the replacement -----------

KEYED_DATA = [("abcdef"[i % 6], i) for i in range(90)]


def _keyed_sum(name: str, downstream: bool) -> Flow:
    """A running sum per key, released by the keyed stage's sink ``out``; ``downstream``: the
    keyed stage also feeds a second keyed stage (a count per parity of the sums) with a sink."""
    f = Flow(name)
    sums = f.source(MemorySource(KEYED_DATA, partitions=3)).key_by(lambda x: x[0]).stateful_map(lambda s, x: ((s or 0) + x[1],) * 2)
    sums.sink(MemorySink("out"))
    if downstream:
        sums.key_by(lambda v: v % 2).stateful_map(lambda n, v: ((n or 0) + 1,) * 2).sink(MemorySink("parity"))
    return f


def _released_past_the_cut(flow: Flow, seed: int) -> tuple:
    """One seeded run (parallelism 3, one crash): (simulation, result, the elements at or above
    the cut that the sinks of the instances outside the failed one's downstream held when it
    was first told a frontier above the cut (None: it never was))."""
    sim = Simulation(flow.plan(3), _config(seed), crashes=1)
    seen: dict = {}
    send = sim._send_control

    def recorder(sender, receiver, message) -> None:
        if sim.failed and "held" not in seen and type(message) is Watermark and receiver == sim.failed[0]:
            cut = sim.local.parts[receiver].cut
            if cut is not None and message.t > cut:
                down = sim.local.cones.downstream[receiver]
                seen["held"] = sum(m[:4] >= cut for key, host in sim.live.hosts.items() if key not in down
                                   for pairs in host.rt.collected().values() for m, _ in pairs)
        send(sender, receiver, message)

    sim._send_control = recorder
    result = sim.run()
    return sim, result, seen.get("held")


@pytest.mark.parametrize("downstream", [False, True], ids=["sink", "feeds-a-stage"])
def test_the_others_release_while_a_replacement_catches_up(downstream):
    """Each instance is told the least open time over its upstream cone while a failed keyed
    instance recovers (ordering/receiver_frontiers.py): the other keyed instances' sinks take
    output past the cut before the replacement is told anything past it (under one watermark:
    none in any seed), and every output is the failure-free one."""
    flow = _keyed_sum("others", downstream)
    expected = reference_outputs(flow)
    wrong, held = [], []
    for seed in range(FEW):
        sim, result, n = _released_past_the_cut(flow, seed)
        if any(result.output(s) != v for s, v in expected.items()):
            wrong.append(seed)
        if sim.failed and not sim.fallbacks and sim.failed[0].stage == 1 and n is not None:
            held.append(n)
    assert not wrong, f"seeds whose output differs: {wrong}"
    # a third of the seeds fail a keyed instance; in the others' sinks: output past the cut in most
    assert len(held) >= 10 and sum(n > 0 for n in held) > len(held) // 2, held


@pytest.mark.slow  # 60 more seeds of each flow (~6 s; the suite is kept under 20 minutes)
@pytest.mark.parametrize("downstream", [False, True], ids=["sink", "feeds-a-stage"])
def test_more_seeds_of_the_others_releasing(downstream):
    flow = _keyed_sum("others", downstream)
    expected = reference_outputs(flow)
    for seed in range(FEW, FEW + 60):
        sim, result, _ = _released_past_the_cut(flow, seed)
        assert all(result.output(s) == v for s, v in expected.items()), (seed, sim.crash_points)


def test_without_a_failure_every_instance_is_told_the_one_watermark():
    """Frontiers differ only while an instance recovers: with no failure, every instance is
    told the same watermarks, in the same order, as under recovery="global"."""
    flow = _keyed_sum("one", downstream=True)
    for seed in range(20):
        sim = Simulation(flow.plan(3), _config(seed))
        told: dict = {}
        send = sim._send_control

        def recorder(sender, receiver, message, told=told, send=send) -> None:
            if type(message) is Watermark and message.snapshot_id is None:
                told.setdefault(receiver, []).append(message.t)
            send(sender, receiver, message)

        sim._send_control = recorder
        sim.run()
        assert len({tuple(ts) for ts in told.values()}) == 1 and len(told) == len(sim.plan.instances), seed
