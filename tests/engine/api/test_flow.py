"""Build-time validation and the plan: invalid pipelines fail before any actor starts."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow, FlowError
from driftstream.engine.testing import MemorySink, MemorySource


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if anything tries to start Ray or an actor."""
    import driftstream.engine.api.handle as handle
    import driftstream.engine.control.launch as launch

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started for an invalid flow")

    monkeypatch.setattr(launch, "ensure_ray", refuse)
    monkeypatch.setattr(handle, "ensure_ray", refuse)


def test_stateful_without_key_by_says_to_add_key_by(no_ray):
    flow = Flow("f")
    with pytest.raises(FlowError, match=r"stateful_map needs a keyed stream; call \.key_by\(key_fn\) right before"):
        flow.source(MemorySource([1])).map(abs).stateful_map(lambda s, x: (s, x))
    with pytest.raises(FlowError, match=r"step 'agg': stateful_flat_map needs a keyed stream"):
        flow.source(MemorySource([1]), name="s2").stateful_flat_map(lambda s, x: (s, [x]), name="agg")


def test_stateful_after_key_by_then_map_is_rejected(no_ray):
    flow = Flow("f")
    with pytest.raises(FlowError, match="key_by"):
        flow.source(MemorySource([1])).key_by(str).map(abs).stateful_map(lambda s, x: (s, x))


def test_no_sink_fails_at_run_before_ray(no_ray):
    flow = Flow("nosink")
    flow.source(MemorySource([1])).map(abs)
    with pytest.raises(FlowError, match=r"has no sink: end a stream with \.sink\(MemorySink\('out'\)\)"):
        flow.run(parallelism=2)


@pytest.mark.parametrize("niceness", [-1, 20, 2.5])
def test_a_coordinator_niceness_out_of_range_fails_before_ray(no_ray, niceness):
    flow = Flow("nice")
    flow.source(MemorySource([1])).sink(MemorySink("out"))
    with pytest.raises(FlowError, match=r"coordinator_niceness is an int from 0 .* to 19, not " + str(niceness)):
        flow.run(coordinator_niceness=niceness)


def test_no_source_fails(no_ray):
    with pytest.raises(FlowError, match="has no source"):
        Flow("empty").run()


def test_a_source_that_reaches_no_sink_is_named(no_ray):
    flow = Flow("dangling")
    flow.source(MemorySource([1]), name="used").sink(MemorySink("out"))
    flow.source(MemorySource([2]), name="forgotten").map(abs)
    with pytest.raises(FlowError, match="source 'forgotten' reaches no sink"):
        flow.run()


def test_duplicate_names_are_rejected_with_the_name():
    flow = Flow("dup")
    s = flow.source(MemorySource([1]), name="src")
    s.map(abs, name="clean")
    with pytest.raises(FlowError, match="step name 'clean' is used twice in flow 'dup': give each step a unique name="):
        s.map(abs, name="clean")
    with pytest.raises(FlowError, match="'out' is used twice"):
        s.sink(MemorySink("out"))
        s.sink(MemorySink("out"))


@pytest.mark.parametrize("method", ["map", "flat_map", "filter", "key_by"])
def test_non_callable_functions_are_rejected(method):
    flow = Flow("nc")
    s = flow.source(MemorySource([1]))
    with pytest.raises(FlowError, match=rf"{method} needs a callable \(a function or lambda\), got str"):
        getattr(s, method)("not a function")


def test_non_callable_stateful_function_is_rejected():
    flow = Flow("nc")
    with pytest.raises(FlowError, match="stateful_map needs a callable"):
        flow.source(MemorySource([1])).key_by(str).stateful_map(42)


def test_bad_names_and_arguments():
    for name in ("a/b", ".", "..", "flow\n", "-flow", ""):  # names that become paths and actor names
        with pytest.raises(FlowError, match="invalid"):
            Flow(name)
    flow = Flow("ok")
    with pytest.raises(FlowError, match="takes a Source"):
        flow.source([1, 2, 3])
    with pytest.raises(FlowError, match="takes a Sink"):
        flow.source(MemorySource([1])).sink("out")
    with pytest.raises(FlowError, match="parallelism must be an int >= 1"):
        flow.plan(0)
    good = Flow("good")
    good.source(MemorySource([1])).sink(MemorySink("o"))
    with pytest.raises(FlowError, match="unknown runtime 'spark'"):
        good.run(runtime="spark")


def test_plan_fuses_chains_and_names_actors():
    flow = Flow("wc")
    (
        flow.source(MemorySource(["a b"]), name="lines")
        .flat_map(str.split, name="split")
        .filter(bool, name="nonempty")
        .key_by(lambda w: w, name="by_word")
        .stateful_map(lambda n, w: ((n or 0) + 1, (w, (n or 0) + 1)), name="count")
        .key_by(lambda wc: wc[1], name="by_count")
        .stateful_map(lambda s, wc: (s, wc), name="again")
        .sink(MemorySink("out"))
    )
    plan = flow.plan(parallelism=2)
    assert [(s.name, s.steps) for s in plan.stages] == [
        ("lines", ["lines", "split", "nonempty"]),
        ("by_word", ["by_word", "count"]),
        ("by_count", ["by_count", "again", "out"]),
    ]
    assert plan.stages[1].actor_names == ["wc/by_word/0", "wc/by_word/1"]
    assert "stage by_word: by_word -> count" in plan.describe()


def test_merge_within_a_stage_stays_fused_and_across_stages_starts_one():
    flow = Flow("m")
    s = flow.source(MemorySource([1]), name="s")
    s.map(abs, name="a").merge(s.map(abs, name="b"), name="same").sink(MemorySink("o1"))
    t = flow.source(MemorySource([2]), name="t")
    s.merge(t, name="across").sink(MemorySink("o2"))
    stages = {st.name: st.steps for st in flow.plan(1).stages}
    assert stages["s"] == ["s", "a", "b", "same", "o1"]
    assert stages["across"] == ["across", "o2"]


def test_stateless_steps_declare_themselves_not_deterministic_and_the_plan_shows_it():
    flow = Flow("nd")
    (flow.source(MemorySource([1]), name="src").map(abs, name="m", deterministic=False).flat_map(lambda x: [x], name="fm")
         .filter(bool, name="keep", deterministic=False).map_batches(lambda b: b, name="mb", deterministic=False)
         .flat_map_batches(lambda b: (b, list(range(b.num_rows))), name="fmb", deterministic=False).sink(MemorySink("o")))
    plan = flow.plan(1)
    assert plan.logged_steps == ["m", "keep", "mb", "fmb"]
    assert "src -> m (logged) -> fm -> keep (logged) -> mb (logged) -> fmb (logged) -> o" in plan.describe()


def test_deterministic_takes_a_bool_and_stateful_steps_refuse_false(no_ray):
    keyed = Flow("nd").source(MemorySource([1])).key_by(str)
    with pytest.raises(FlowError, match=r"step 'map': deterministic= is True or False, not 'no'"):
        keyed.map(abs, deterministic="no")
    for method in ("stateful_map", "stateful_flat_map"):
        with pytest.raises(FlowError, match=rf"step 'sum': a stateful step cannot be deterministic=False.*"
                                            r"\.map\(fn, deterministic=False\) before the key_by"):
            getattr(keyed, method)(lambda s, x: (s, x), name="sum", deterministic=False)
    assert keyed.stateful_map(lambda s, x: (s, x), name="ok", deterministic=True).step.deterministic
