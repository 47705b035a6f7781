"""The operator of a step declared deterministic=False: logged outputs replayed, not
recomputed; tombstones take back what was emitted; outputs attributed to their inputs for
every stateless kind."""

from __future__ import annotations

import itertools

from driftstream.ordering.meta import Meta
from driftstream.snapshots.output_log import OutputLog

from driftstream.engine import Flow
from driftstream.engine.runtime.logged_step import LoggedStep
from driftstream.engine.runtime.operator_registry import operator_for
from driftstream.engine.runtime.operators import DeadLettering, Filter, FlatMap, Map, StepContext
from driftstream.engine.testing import MemorySink, MemorySource


def _draws() -> itertools.count:
    return itertools.count(1)


def _m(t: int, *ids: int, tombstone: bool = False) -> Meta:
    return Meta(t, 0, 0, t, tuple(ids), tombstone)


def test_an_element_logged_before_a_restore_gets_its_logged_outputs():
    draws = _draws()
    op = LoggedStep(Map("noisy", lambda x: (x, next(draws))), OutputLog(), flat=False)
    op.log.load([(_m(1), [(_m(1), (10, 99), None)])], since=None)
    out = op.run([(_m(1), 10, None), (_m(2), 20, None)])
    assert out == [(_m(1), (10, 99), None), (_m(2), (20, 1), None)]  # one call: for the element not logged
    assert [m for m, _ in op.log.pending] == [_m(2)]  # only what was computed is written


def test_a_tombstone_takes_back_what_its_element_gave_not_a_new_draw():
    draws = _draws()
    op = LoggedStep(Map("noisy", lambda x: (x, next(draws))), OutputLog(), flat=False)
    first = op.run([(_m(1), 10, None)])
    back = op.run([(_m(1, tombstone=True), 10, None)])
    assert [(m.tombstone if isinstance(m, Meta) else m[5], p) for m, p, _ in back] == [(True, first[0][1])]
    again = op.run([(_m(1), 10, None)])  # its new version is a new draw, logged again
    assert again[0][1] == (10, 2) and op.log.appended == 2


def test_an_element_its_tombstone_and_its_new_version_in_one_batch():
    draws = _draws()
    op = LoggedStep(Map("noisy", lambda x: (x, next(draws))), OutputLog(), flat=False)
    out = op.run([(_m(1), 10, None), (_m(1, tombstone=True), 10, None), (_m(1), 11, None)])
    assert [p for _, p, _ in out] == [(10, 1), (10, 1), (11, 2)]
    assert op.log.emitted[_m(1)] == [(_m(1), (11, 2), None)]


def test_a_flat_map_s_outputs_are_its_inputs_children():
    draws = _draws()
    op = LoggedStep(FlatMap("split", lambda x: [x] * (next(draws) % 3)), OutputLog(), flat=True)
    out = op.run([(_m(1), "a", None), (_m(2), "b", None), (_m(3), "c", None)])
    assert [(m, p) for m, p, _ in out] == [(_m(1, 0), "a"), (_m(2, 0), "b"), (_m(2, 1), "b")]
    assert {m: [o[0] for o in outs] for m, outs in op.log.pending} == {_m(1): [_m(1, 0)], _m(2): [_m(2, 0), _m(2, 1)], _m(3): []}
    back = op.run([(_m(2, tombstone=True), "b", None)])
    assert [m for m, _, _ in back] == [_m(2, 0, tombstone=True), _m(2, 1, tombstone=True)]


def test_a_filter_logs_what_it_kept_with_its_key():
    draws = _draws()
    op = LoggedStep(Filter("sample", lambda x: next(draws) % 2 == 0), OutputLog(), flat=False)
    out = op.run([(_m(1), "a", "k1"), (_m(2), "b", "k2")])
    assert out == [(_m(2), "b", "k2")] and dict(op.log.pending) == {_m(1): [], _m(2): [(_m(2), "b", "k2")]}


def test_dead_letters_are_logged_outputs_too():
    op = LoggedStep(DeadLettering(Map("inverse", lambda x: 1 / x)), OutputLog(), flat=False)
    out = op.run([(_m(1), 0, None), (_m(2), 4, None)])
    assert out[1] == (_m(2), 0.25, None) and out[0][1].error == "ZeroDivisionError: division by zero"
    assert [m for m, _ in op.log.pending] == [_m(1), _m(2)]


def test_the_registry_logs_the_declared_steps_only():
    f = Flow("reg")
    (f.source(MemorySource([1])).map(abs, name="plain").map(abs, name="noisy", deterministic=False)
      .flat_map_batches(lambda b: (b, list(range(b.num_rows))), name="rows", deterministic=False).sink(MemorySink("o")))
    plan = f.plan(1)
    ctx = StepContext(plan, 0, None, None, lambda: 7, lambda: {}, {}, {})
    ops = {s.name: operator_for(s, ctx) for s in plan.steps}
    assert type(ops["plain"]) is Map
    assert type(ops["noisy"]) is LoggedStep and not ops["noisy"].flat
    assert type(ops["rows"]) is LoggedStep and ops["rows"].flat


def test_the_watermark_forgets_settled_inputs():
    op = LoggedStep(Map("noisy", str), OutputLog(), flat=False)
    op.run([(_m(t), t, None) for t in range(200)])
    op.settle((150,))
    assert min(op.log.emitted) == _m(150)
