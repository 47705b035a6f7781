"""The plan's layout: at parallelism 1 a key_by stays in its input's stage (a fused plan),
at any other (or with fuse=False) it starts a stage; rescaling lays the stages out again."""

from __future__ import annotations

from driftstream.engine import Flow, KafkaSink
from driftstream.engine.testing import MemorySink, MemorySource


def _counts(name: str = "p") -> Flow:
    f = Flow(name)
    f.source(MemorySource([1], partitions=2), name="src").map(abs, name="abs").key_by(str, name="k").count(name="n").sink(MemorySink("o"))
    return f


def test_at_parallelism_1_the_whole_flow_is_one_fused_stage_and_describe_says_so():
    plan = _counts().plan(1)
    assert plan.fused and [(s.name, s.steps, s.actor_names, s.entries) for s in plan.stages] == [
        ("src", ["src", "abs", "k", "n", "o"], ["p/src/0"], [])]
    assert all(not chans for chans in plan.channels.values())  # no data plane between its steps
    assert "stage src (fused): src -> abs -> k -> n -> o" in plan.describe()
    assert plan.keyed_names(plan.stages[0]) == ["k"] and plan.keyed_stages == plan.stages


def test_fuse_false_and_other_parallelisms_keep_a_stage_per_key_by():
    for plan in (_counts().plan(1, fuse=False), _counts().plan(2), _counts().plan(1).unfused()):
        assert not plan.fused and [s.steps for s in plan.stages] == [["src", "abs"], ["k", "n", "o"]]
        assert [c.keyed for c in plan.channels[1]] == [True] and "(fused)" not in plan.describe()
        assert [plan.keyed_names(s) for s in plan.keyed_stages] == [["k"]]


def test_with_parallelism_lays_the_stages_out_again_both_ways():
    one = _counts().plan(1)
    two = one.with_parallelism(2)
    assert [s.actor_names for s in two.stages] == [["p/src/0", "p/src/1"], ["p/k/0", "p/k/1"]] and not two.fused
    back = two.with_parallelism(1)
    assert back.fused and [s.steps for s in back.stages] == [s.steps for s in one.stages]
    assert back.channels == one.channels and back.successors == one.successors
    assert not _counts().plan(1, fuse=False).with_parallelism(2).with_parallelism(1).fused  # fuse=False stays


def test_a_keyed_kafka_sink_at_1_is_fused_behind_its_partition_route():
    """Its key_by (the Kafka partition route) runs in the source's stage: the one instance writes
    every partition, as it did at 1 behind a shuffle."""
    f = Flow("kp")
    f.source(MemorySource([{"k": "a"}]), name="src").sink(KafkaSink("t", "127.0.0.1:1", name="keyed", key=lambda d: d["k"]))
    plan = f.plan(1)
    assert [s.steps for s in plan.stages] == [["src", "keyed.by_partition", "keyed"]]
    assert [s.steps for s in f.plan(3).stages] == [["src"], ["keyed.by_partition", "keyed"]]


def test_two_sources_keep_their_stages_and_a_key_by_after_their_merge_runs_in_the_merges():
    f = Flow("two")
    a = f.source(MemorySource([1]), name="a")
    b = f.source(MemorySource([2]), name="b")
    a.merge(b, name="both").key_by(str, name="k").count(name="n").sink(MemorySink("o"))
    plan = f.plan(1)
    assert [s.steps for s in plan.stages] == [["a"], ["b"], ["both", "k", "n", "o"]]
    assert all(not c.keyed for chans in plan.channels.values() for c in chans)  # forward: instance 0 to 0
    assert [s.steps for s in f.plan(2).stages] == [["a"], ["b"], ["both"], ["k", "n", "o"]]
