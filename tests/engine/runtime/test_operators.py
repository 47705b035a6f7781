"""The operators of a stage: what each step kind does with a batch, and how it fails."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.errors import DeadLetter, StepError
from driftstream.engine.runtime.operator_registry import operator_for
from driftstream.engine.runtime.operators import (
    DeadLettering, DeadLetterSplit, Filter, FlatMap, KeyBy, Keyed, Map, Passthrough, SinkStep, StepContext, Timed,
)
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.engine.windows import Tumbling
from driftstream.ordering.meta import Meta


def items(*payloads, key=None) -> list:
    return [(Meta(0, 0, 0, i), p, key) for i, p in enumerate(payloads)]


def expand(x: int) -> list:
    if x < 0:
        raise ValueError("negative")
    return [x] * x


def test_a_flat_map_numbers_its_outputs_as_children_of_their_element():
    out = FlatMap("expand", expand).run(items(2, 0, 1))
    assert [(m[3], m[4], p) for m, p, _ in out] == [(0, (0,), 2), (0, (1,), 2), (2, (0,), 1)]


def test_each_stateless_kind_names_its_step_and_the_failing_element():
    for op in (Map("m", lambda x: 1 // x), FlatMap("f", expand), Filter("k", lambda x: 1 // (x + 1))):
        failing = -1 if op.name != "m" else 0
        with pytest.raises(StepError) as err:
            op.run(items(3, failing, 5))
        assert (err.value.step, err.value.element, err.value.t[3]) == (op.name, repr(failing), 1)


def test_dead_lettering_diverts_a_flat_map_element_whole_at_its_first_childs_t():
    out = DeadLettering(FlatMap("expand", expand)).run(items(1, -1, 2))
    letter = out[1]
    assert [p for _, p, _ in out[:1] + out[2:]] == [1, 2, 2]  # nothing of -1 but its letter
    assert isinstance(letter[1], DeadLetter) and letter[0][3:5] == (1, (0,))
    assert letter[1].traceback.count("File") == 1  # the user's frame alone, none of the engine's


def test_dead_lettering_keeps_a_filtered_elements_key_with_its_letter():
    out = DeadLettering(Filter("k", lambda x: 1 // x)).run(items(0, 1, key="key"))
    assert [(type(p).__name__, k) for _, p, k in out] == [("DeadLetter", "key"), ("int", "key")]


def test_the_dead_letter_split_counts_letters_less_their_tombstones():
    letters: dict = {}
    split = DeadLetterSplit("m.dead_letters", "m", letters)
    letter = DeadLetter("m", 1, (0, 0, 0, 0, ()), "E", "")
    tomb = Meta(0, 0, 0, 0, (), True)
    assert len(split.run(items(letter, "fine", letter))) == 2
    split.run([(tomb, letter, None)])
    assert letters == {"m": 1}


def test_every_step_of_a_plan_gets_the_operator_of_its_kind():
    flow = Flow("kinds").dead_letters(MemorySink("dlq"))
    (flow.source(MemorySource([1, 2])).map(int, on_error="dead-letter").filter(bool).flat_map(lambda x: [x])
     .key_by(str).stateful_map(lambda s, x: (x, x)).key_by(str)
     .window(Tumbling(10), timestamp=lambda x: x).count().sink(MemorySink("out")))
    for fuse, key_by in ((False, Passthrough), (True, KeyBy)):  # a keyed channel computes the key, or (fused) the step
        plan = flow.plan(1, fuse=fuse)
        ctx = StepContext(plan, 0, None, None, lambda: 7, lambda: {}, {}, {})
        kinds = {step.name: type(operator_for(step, ctx)) for step in plan.steps}
        assert kinds["map"] is DeadLettering and kinds["filter"] is Filter and kinds["flat_map"] is FlatMap
        assert kinds["key_by"] is key_by and kinds["stateful_map"] is Keyed
        assert Timed in kinds.values() and kinds["out"] is SinkStep


def test_a_timed_operator_fires_its_windows_on_the_watermark_and_gives_their_timers_back():
    from driftstream.engine.runtime.operator_registry import operator_for
    from driftstream.ordering.ack_table import AckTable

    flow = Flow("timers")
    flow.source(MemorySource([])).key_by(str).window(Tumbling(1.0), timestamp=lambda x: x).count().sink(MemorySink("out"))
    plan = flow.plan(1)
    acks = AckTable()
    ctx = StepContext(plan, 0, None, None, lambda: 7, lambda: acks, AckTable(), {})
    window = operator_for(next(s for s in plan.steps if s.kind.timed), ctx)
    assert window.run([(Meta(100, 0, 0, 0), 0.1, "k"), (Meta(200, 0, 0, 1), 0.2, "k")]) == []
    assert [v for v in acks.values() if v]  # the window's timer holds the watermark at its close
    window.settle((500, 0, 0, 0))
    assert window.on_watermark((500, 0, 0, 0)) == []  # not closed yet
    fired = window.on_watermark((1000, 0, 0, 0))
    assert [(p.key, p.value) for _, p, _ in fired] == [("k", 2)]
    assert not any(acks.values())  # the timer's XOR is back out


def _keyed_channel_outputs(fn, on_error: str, payloads: list) -> list:
    """What an unfused key_by's keyed channel (Outbound.route) hands the key_by's stage."""
    from driftstream.engine.runtime.outbound import Outbound
    from driftstream.ordering.ack_table import AckTable

    flow = Flow("route").dead_letters(MemorySink("dlq"))
    flow.source(MemorySource([])).key_by(fn, name="k", on_error=on_error).sink(MemorySink("out"))
    plan = flow.plan(2)
    out = Outbound(plan, 0, iter(range(1, 99)).__next__)
    for ch in plan.channels[plan.stages[0].step_ids[-1]]:
        out.route(ch, [(Meta(i, 0, 0, i), p, None) for i, p in enumerate(payloads)], AckTable())
    return sorted(item for _, _, batch in out.take((0, 0), False) for item in batch.items)


def _length(x):
    return len(x)


def test_a_fused_key_by_keys_as_the_keyed_channel_does_its_dead_letters_alike():
    """Fused (parallelism 1), a key_by computes its key in its input's stage: the same keys,
    and with on_error="dead-letter" the same dead letters keyed by the step's name."""
    payloads = ["ab", 3, "c"]
    fused = KeyBy("k", _length, divert=True).run([(Meta(i, 0, 0, i), p, None) for i, p in enumerate(payloads)])
    assert [(p, k) for _, p, k in fused if not isinstance(p, DeadLetter)] == [("ab", 2), ("c", 1)]
    routed = _keyed_channel_outputs(_length, "dead-letter", payloads)  # its traceback: the user's frame alone, as here
    letters = [(m, p.step, p.error, p.element, p.traceback, k) for m, p, k in fused if isinstance(p, DeadLetter)]
    assert letters == [(m, p.step, p.error, p.element, p.traceback, k) for m, p, k in routed if isinstance(p, DeadLetter)]
    assert letters[0][1:3] == ("k", "TypeError: object of type 'int' has no len()") and letters[0][5] == "k"


def test_a_fused_key_by_that_raises_fails_naming_the_step_and_the_element():
    with pytest.raises(StepError, match="step 'k' failed on element value 3") as failed:
        KeyBy("k", len, divert=False).run([(Meta(0, 0, 0, 0), "ab", None), (Meta(1, 0, 0, 1), 3, None)])
    with pytest.raises(StepError) as routed:
        _keyed_channel_outputs(len, "fail", ["ab", 3])
    assert str(failed.value).splitlines()[0] == str(routed.value).splitlines()[0]
