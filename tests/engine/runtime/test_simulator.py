"""Determinism on the simulator: any seed, any parallelism gives the sequential reference's output."""

from hypothesis import given, settings, strategies as st

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.runtime.simulator import Simulation
from driftstream.engine.testing import MemorySink, MemorySource

from tests.pipelines import STATE_REKEY_STATE, build, inputs, ops
from tests.reference import reference_outputs


@settings(max_examples=150, deadline=None)
@given(data=inputs, op_names=ops, parallelism=st.integers(1, 4), partitions=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_any_seed_matches_sequential_reference(data, op_names, parallelism, partitions, seed):
    flow = build("prop", data, op_names, partitions)
    expected = reference_outputs(flow)["out"]
    assert flow.run(runtime="simulator", parallelism=parallelism, seed=seed).output("out") == expected


@settings(max_examples=60, deadline=None)
@given(data=inputs, parallelism=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_state_rekey_state_matches_reference(data, parallelism, seed):
    flow = build("srs", data, STATE_REKEY_STATE)
    assert flow.run(runtime="simulator", parallelism=parallelism, seed=seed).output("out") == reference_outputs(flow)["out"]


def test_late_arrivals_really_happen_and_no_tombstone_reaches_a_sink():
    data = [("ab"[i % 2], "xyz"[i % 3] * (1 + i % 2)) for i in range(300)]
    flow = build("late", data, STATE_REKEY_STATE, partitions=3)
    expected = reference_outputs(flow)["out"]
    tombstones = 0
    for seed in range(5):
        result = flow.run(runtime="simulator", parallelism=3, seed=seed, max_inflight=200)
        assert result.output("out") == expected
        tombstones += result.metrics.total_tombstones
        assert sum(result.metrics.tombstones_at_sinks.values()) == 0
    assert tombstones > 0  # the adversarial scheduler did deliver out of order


def test_merge_of_two_sources_is_deterministic():
    flow = Flow("merged")
    a = flow.source(MemorySource(["a1", "a2", "a3"]), name="a")
    b = flow.source(MemorySource(["b1", "b2"], partitions=2), name="b")
    a.merge(b).key_by(lambda s: "all").stateful_map(lambda st, x: ((st or "") + x[1], (st or "") + x[1])).sink(MemorySink("out"))
    outs = {tuple(flow.run(runtime="simulator", parallelism=2, seed=s).output("out")) for s in range(30)}
    assert outs == {tuple(reference_outputs(flow)["out"])}


def test_simulation_is_reproducible_per_seed():
    flow = build("rep", [("a", "x"), ("b", "yy"), ("a", "z")] * 10, STATE_REKEY_STATE)
    runs = [Simulation(flow.plan(2), RunConfig(seed=11)) for _ in range(2)]
    for r in runs:
        r.run()
    assert runs[0].steps_taken == runs[1].steps_taken


def test_merge_of_two_branches_of_one_element_is_deterministic():
    # Both branches carry the same input Meta; merge tags them by input position.
    flow = Flow("branches")
    keyed = flow.source(MemorySource([("k", c) for c in "abcdef"], partitions=2)).key_by(lambda kv: kv[0])
    left = keyed.stateful_map(lambda s, kv: ((s or "") + kv[1], "L" + (s or "") + kv[1]))
    right = keyed.stateful_map(lambda s, kv: ((s or "") + kv[1].upper(), "R" + (s or "") + kv[1].upper()))
    left.merge(right).key_by(lambda x: "one").stateful_map(lambda s, x: ((s or "") + x[-1], (s or "") + x[-1])).sink(MemorySink("out"))
    expected = reference_outputs(flow)["out"]
    assert expected[-1] == "aAbBcCdDeEfF"  # per element: the left branch (input 0), then the right
    outs = {tuple(flow.run(runtime="simulator", parallelism=3, seed=s).output("out")) for s in range(40)}
    assert outs == {tuple(expected)}
