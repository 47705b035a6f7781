"""UnsettledInputs: whatever a failed sender's stream delivered at or above the cut, in any
order and any prefix, plus what cancel returns, nets to nothing; below the cut nothing is
cancelled."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from driftstream.ordering.meta import invalidee_of
from driftstream.ordering.unsettled_inputs import UnsettledInputs


def net(items) -> Counter:
    c: Counter = Counter()
    for meta, payload, _ in items:
        c[(invalidee_of(meta), payload)] += -1 if meta[5] else 1
    return Counter({k: v for k, v in c.items() if v})


def m(ts, tomb=False):
    return (ts, 0, 0, ts, (), tomb)


def test_settled_items_are_forgotten_and_never_cancelled():
    u = UnsettledInputs()
    u.record("x", 1, [(m(1), "a", "k"), (m(6), "b", "k")])
    u.settle((3,))
    assert u.cancel("x", (0,)) == {1: [(m(6, True), "b", "k")]}


def test_items_below_the_cut_are_kept_not_cancelled():
    u = UnsettledInputs()
    u.record("x", 1, [(m(1), "a", "k"), (m(6), "b", "k")])
    assert u.cancel("x", (5,)) == {1: [(m(6, True), "b", "k")]}
    assert u.cancel("x", (0,)) == {1: [(m(1, True), "a", "k")]}


def test_other_senders_are_untouched():
    u = UnsettledInputs()
    u.record("x", 1, [(m(4), "a", "k")])
    u.record("y", 1, [(m(5), "b", "k")])
    assert u.cancel("x", (0,)) == {1: [(m(4, True), "a", "k")]}
    assert u.cancel("y", (0,)) == {1: [(m(5, True), "b", "k")]}


def _stream(draw_ops):
    """A sender's consistent stream: each element, later maybe its tombstone and a re-emission."""
    out = []
    for ts, payloads in draw_ops:
        for i, p in enumerate(payloads):
            out.append((m(ts), p, "k"))
            if i < len(payloads) - 1:
                out.append((m(ts, True), p, "k"))  # retracted, re-emitted as the next payload
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.lists(st.sampled_from("abc"), min_size=1, max_size=3)), max_size=8, unique_by=lambda x: x[0]),
       st.randoms(use_true_random=False), st.integers(0, 9), st.integers(0, 9))
def test_received_plus_cancel_nets_to_nothing_at_or_above_the_cut(ops, rnd, cut, settled):
    stream = _stream(ops)
    got = [x for x in stream if rnd.random() < 0.7]  # what arrived before the failure, in any order
    rnd.shuffle(got)
    settled = min(settled, cut)
    u = UnsettledInputs()
    for i in range(0, len(got), 2):
        u.record("x", 3, got[i:i + 2])
    u.settle((settled, 0, 0, settled))
    undo = u.cancel("x", (cut, 0, 0, cut)).get(3, [])
    above = [x for x in got if x[0][0] >= cut]
    assert net(above + undo) == Counter()
    assert all(x[0][0] >= cut for x in undo)
