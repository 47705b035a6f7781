"""ReexecutedStep: one batch in N re-run on a copy (from a seeded phase), every batch's settled
reads checked; a difference goes to ``on_mismatch`` with the step, the instance, the batch's t
range and, for a settled read, the time a snapshot must be below. InstanceHost wraps the keyed
steps only under verify="reexecute:N"."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

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


class _Inline:
    """A link that re-runs each shipment at once, after a pickle round trip (as on the verifier)."""

    def __init__(self, fn):
        self.fn, self.found, self.dropped = fn, [], 0

    def full(self) -> bool:
        return False

    def submit(self, shipment, expected, step, instance, watermark) -> bool:
        import pickle

        from driftstream.ordering.entry_state import EntryKeyedState
        from driftstream.ordering.shipped_reexecution import rerun

        self.found += rerun(pickle.loads(pickle.dumps(shipment)), lambda backend: EntryKeyedState(self.fn, backend=backend)).found
        return True


def _index(pages, x):
    pages.put(x, pages.get(x, 0) + 1)
    return pages.get("p0", 0) + len(pages)  # a busy key reads a record that folds while its log is never empty


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_shipped_re_runs_of_a_busy_entry_state_agree_while_its_reads_are_forgotten(seed):
    """The entries a key's log read are kept since its oldest element not folded arrived: the
    shipped re-runs agree for any arrival order and folds, and the set stays the size of that
    window, though the key's log never empties."""
    from driftstream.ordering.entry_state import EntryKeyedState

    rng = random.Random(seed)
    link = _Inline(_index)
    op = ReexecutedStep(Keyed("index", EntryKeyedState(_index)), 1, 0, "1/0", link.found.append, link, 0)
    elements = [(_meta(t), f"p{rng.randrange(200)}", "word") for t in range(1, 121)]
    sent, watermark, runs = 0, 1, []  # runs: (the watermark when a batch ran, its elements)
    while sent < len(elements):
        n = rng.randint(1, 6)
        batch = elements[sent:sent + n]
        rng.shuffle(batch)
        sent += n
        runs.append((watermark, batch))
        op.run(batch)
        if rng.random() < 0.5:
            watermark = max(watermark, max(1, min(sent, len(elements)) - rng.randint(1, 8)))  # the log never empties
            op.settle((watermark,))
    assert link.found == [] and op.reexecuted == op.batches
    # The last batch's shipment kept what was read or folded since the batch that brought the
    # oldest element not folded at its run; every log entry since then is at or past the watermark
    # of that batch's run. Not more: the pages of those elements, the size record and "p0", which
    # every application reads.
    last = runs[-1][0]
    since = next(w for w, batch in runs if any(meta[0] >= last for meta, _, _ in batch))
    window = {page for meta, page, _ in elements if meta[0] >= since} | {"p0", ("__driftstream_size__",)}
    kept = set(op.state.backend.read["word"])
    assert kept <= window and len(kept) < len({page for _, page, _ in elements}) + 2
