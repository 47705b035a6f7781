"""ReexecutedStep: one batch in N re-run on a copy (from a seeded phase), every batch's settled
reads checked; a difference goes to ``on_mismatch`` with the step, the instance, the batch's t
range and, for a settled read, the time a snapshot must be below. InstanceHost wraps the keyed
steps only under verify="reexecute:N"."""

from __future__ import annotations

from driftstream.engine import Flow, MapState
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.instance_host import InstanceHost
from driftstream.engine.runtime.operators import Keyed
from driftstream.engine.runtime.reexecuted_step import ReexecutedStep, SilentCorruption
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.ordering.keyed_state import DriftingKeyedState


def _sum(state, x):
    return (state or 0) + x, (state or 0) + x


def _meta(t):
    return (t, 0, 0, t, (), False)


def _op(every, phase, found):
    return ReexecutedStep(Keyed("sum", DriftingKeyedState(_sum)), every, phase, "1/0", found.append)


def test_one_batch_in_n_is_re_run_from_its_phase():
    found: list = []
    op = _op(3, 1, found)
    for t in range(1, 8):
        op.run([(_meta(t), t, "k")])
    assert op.reexecuted == 3 and op.batches == 7 and found == []  # batches 1, 4 and 7


def test_a_wrong_result_in_a_re_run_batch_is_reported_with_its_t_range():
    found: list = []
    op = _op(1, 0, found)
    op.run([(_meta(1), 5, "k")])
    right = op.state.fn
    op.state.fn = lambda s, x: (right(s, x)[0] + 1, right(s, x)[1])  # the live function computes wrong
    op.run([(_meta(2), 1, "k"), (_meta(3), 1, "j")])
    [exc] = found
    assert isinstance(exc, SilentCorruption)
    record = exc.record
    assert (record.step, record.instance, record.t_range[0][:1], record.t_range[1][:1], record.before) == ("sum", "1/0", (2,), (3,), None)
    assert {getattr(f, "kind", None) for f in record.found} >= {"state"} and "silent corruption in step 'sum'" in str(exc)


def test_a_flipped_settled_value_is_reported_at_its_read_with_the_time_it_was_right():
    found: list = []
    op = _op(1000, 999, found)  # no re-run: the read alone
    op.run([(_meta(1), 5, "k")])
    op.settle((2,))  # folded at watermark (2,)
    op.state.backend.inner.put("k", 4)
    op.run([(_meta(3), 1, "k")])
    [exc] = found
    assert exc.record.before == (2,) and exc.record.watermark == (2,)


def _host(verify_every):
    flow = Flow("rx")
    s = flow.source(MemorySource([1, 2, 3])).key_by(str)
    s.stateful_map(_sum).sink(MemorySink("a"))
    s.stateful_map(lambda entries, x: entries.put("n", x), state=MapState).sink(MemorySink("b"))
    plan = flow.plan(1)
    key = plan.instances[0]
    return InstanceHost(plan, key, InstanceConfig(reexecute=verify_every), StageSnapshots(None, plan.participant(key), None),
                        send=lambda *m: None)


def test_the_host_wraps_its_keyed_steps_only_under_reexecute():
    assert not any(isinstance(op, ReexecutedStep) for op in _host(None).rt.operators.values())
    host = _host(5)
    wrapped = [op for op in host.rt.operators.values() if isinstance(op, ReexecutedStep)]
    assert len(wrapped) == 2 and all(op.state is host.rt.keyed[sid] for sid, op in host.rt.operators.items() if op in wrapped)
    host.guarded(host.rt.process_source, host.reader.poll(3))
    host.rt.on_watermark((9,))
    assert [p for _, p in host.rt.collected()["a"]] == [1, 2, 3]


def test_a_re_run_also_checks_other_keys_logs_in_turn():
    """A state gone bad in the log of a key the batch does not touch is found by the sweep."""
    found: list = []
    op = _op(2, 0, found)
    op.run([(_meta(1), 5, "quiet"), (_meta(2), 1, "quiet")])  # batch 1: not re-run
    op.state.logs["quiet"].after[0] = 99
    op.run([(_meta(3), 1, "busy")])  # batch 2: re-run, and the sweep takes "quiet"
    [exc] = found
    assert [(getattr(f, "kind", None), f.key) for f in exc.record.found] == [("state", "quiet")]
