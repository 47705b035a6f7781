"""Re-running a batch on a copy of the touched keys: a copy agrees with a healthy state for any
arrival order (late elements, tombstones), and a state that went bad in its log, or a function
that computed wrong once, is told apart."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from driftstream.ordering.entry_state import EntryKeyedState
from driftstream.ordering.keyed_state import DriftingKeyedState
from driftstream.ordering.meta import Meta
from driftstream.ordering.reexecution import copy_of, key_digest

from tests.ordering.arrival_orders import batches


def _concat(state, x):
    new = (state or "") + x
    return new, new


def _pages(entries, x):
    entries.put(x, entries.get(x, "") + x)
    return len(entries)


def _state(kind: str):
    return DriftingKeyedState(_concat) if kind == "values" else EntryKeyedState(_pages)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["values", "entries"]), st.integers(0, 2**32), st.integers(4, 30))
def test_a_healthy_state_and_its_copy_agree_for_any_arrival_order(kind, seed, n):
    live = _state(kind)
    for batch, watermark in batches(random.Random(seed), [(Meta(i, 0, 0, i), "ab"[i % 2], "kl"[i % 3 == 0]) for i in range(n)]):
        again = copy_of(live, batch)
        out = live.apply_items(batch)
        assert again.run(batch, out, live) == []
        if watermark is not None:
            live.advance(watermark)


def test_a_bad_state_in_the_log_is_told_apart_by_the_state_and_the_outputs():
    live = _state("values")
    live.apply_items([(Meta(1, 0, 0, 1), "a", "k"), (Meta(2, 0, 0, 2), "b", "k")])
    live.logs["k"].after[0] = "x"  # read by nothing new: the states differ, the outputs agree
    batch = [(Meta(3, 0, 0, 3), "c", "k")]
    found = copy_of(live, batch).run(batch, live.apply_items(batch), live)
    assert [m.kind for m in found] == ["state"] and found[0].key == "k" and found[0].live != found[0].copy


def test_a_wrong_result_is_told_apart():
    live = _state("entries")
    batch = [(Meta(1, 0, 0, 1), "a", "k")]
    again = copy_of(live, batch)
    live.fn = lambda entries, x: _pages(entries, x) + 1  # the live function computes wrong
    found = again.run(batch, live.apply_items(batch), live)
    assert [m.kind for m in found] == ["output", "state"]


def test_the_key_digest_covers_an_entry_states_overlay():
    live = _state("entries")
    live.apply_items([(Meta(1, 0, 0, 1), "a", "k")])
    before = key_digest(live, "k")
    live.overlay[("k", "a")][-1] = "b"
    assert key_digest(live, "k") != before and key_digest(live, "other") == key_digest(_state("entries"), "other")
