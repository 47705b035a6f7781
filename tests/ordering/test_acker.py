"""Acker: the watermark never passes a time still in flight; XORs commute; per-instance
source bounds; TOP at the end; a randomized pipeline model with delayed flushes."""

from __future__ import annotations

import random
from functools import reduce

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import BOTTOM, TOP, successor


def T(ts, source=0, partition=0):
    return (ts, source, partition, ts)


def test_no_sources_means_top():
    assert Acker(sources=0).watermark == TOP
    assert Acker(sources=0).update({}) == TOP


def test_bottom_until_every_source_instance_reported():
    a = Acker(sources=3)
    assert a.watermark == BOTTOM
    assert a.update({}, source=0, bound=T(5)) == BOTTOM
    assert a.update({}, source=2, bound=T(7, 2)) == BOTTOM
    assert a.update({}, source=1, bound=T(3, 1)) == successor(T(3, 1))  # the minimum bound


def test_watermark_is_the_minimum_bound_plus_one():
    a = Acker(sources=2)
    a.update({}, source=0, bound=T(4))
    assert a.update({}, source=1, bound=T(9, 1)) == (4, 0, 0, 5)
    assert a.update({}, source=0, bound=T(12)) == (9, 1, 0, 10)
    assert a.update({}, source=1, bound=TOP) == (12, 0, 0, 13)
    assert a.update({}, source=0, bound=TOP) == TOP


def test_non_zero_entry_holds_the_watermark_until_acked():
    a = Acker(sources=1)
    assert a.update({T(1): 0xA, T(2): 0xB}, source=0, bound=T(2)) == T(1)
    assert a.in_flight() == 2
    assert a.update({T(2): 0xB}) == T(1)  # a later time settling does not help
    assert a.update({T(1): 0xA}) == successor(T(2))
    assert a.in_flight() == 0
    assert a.update({}, source=0, bound=TOP) == TOP


def test_children_keep_the_entry_non_zero():
    a = Acker(sources=1)
    parent, child = 0x1111, 0x2222
    a.update({T(1): parent}, source=0, bound=T(1))
    # The child's receiver acks before the parent's receiver flushed: still in flight.
    assert a.update({T(1): child}) == T(1)
    assert a.update({T(1): parent ^ child}) == successor(T(1))


def test_top_only_when_sources_are_done_and_nothing_is_in_flight():
    a = Acker(sources=2)
    a.update({T(3): 7}, source=0, bound=TOP)
    assert a.update({}, source=1, bound=TOP) == T(3)
    assert a.update({T(3): 7}) == TOP
    assert a.in_flight() == 0


def test_watermark_never_moves_back():
    a = Acker(sources=1)
    a.update({}, source=0, bound=T(10))
    w = a.watermark
    # Out of protocol (an entry below the watermark), but the frontier is monotone.
    assert a.update({T(2): 5}) == w
    assert a.update({}, source=0, bound=T(1)) == w


def test_entry_can_go_to_zero_and_come_back():
    a = Acker(sources=1)
    a.update({T(1): 3}, source=0, bound=T(0))
    a.update({T(1): 3})
    assert a.in_flight() == 0
    a.update({T(1): 5, T(2): 6}, source=0, bound=T(2))
    assert a.watermark == T(1)
    a.update({T(1): 5})
    assert a.watermark == T(2)
    a.update({T(2): 6})
    assert a.watermark == successor(T(2))


@settings(max_examples=150, deadline=None)
@given(
    flushes=st.lists(st.dictionaries(st.integers(0, 5).map(T), st.integers(1, 2**64 - 1), max_size=4), max_size=8),
    bound_ts=st.integers(0, 6),
    order=st.randoms(use_true_random=False),
)
def test_xors_in_any_order_give_the_same_final_watermark(flushes, bound_ts, order):
    """Each flush is sent, and later acked by an identical flush: in any order, the end state is the same."""
    messages = [f for f in flushes for _ in range(2)]
    if messages:
        messages.append({t: 0 for t in messages[0]})  # zero XORs are harmless
    shuffled = list(messages)
    order.shuffle(shuffled)
    a = Acker(sources=1)
    a.update({}, source=0, bound=T(bound_ts))
    seen = [a.watermark]
    for m in shuffled:
        seen.append(a.update(m))
    assert seen == sorted(seen)  # monotone
    assert a.in_flight() == 0
    assert a.watermark == successor(T(bound_ts))


@settings(max_examples=150, deadline=None)
@given(
    entries=st.dictionaries(st.integers(0, 8).map(T), st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=3), max_size=5),
    order=st.randoms(use_true_random=False),
)
def test_final_entries_are_the_xor_of_all_updates_in_any_order(entries, order):
    updates = [{t: x} for t, xs in entries.items() for x in xs]
    a, b = Acker(sources=1), Acker(sources=1)
    for u in updates:
        a.update(u)
    shuffled = list(updates)
    order.shuffle(shuffled)
    for u in shuffled:
        b.update(u)
    expected = {t: reduce(lambda p, q: p ^ q, xs) for t, xs in entries.items()}
    expected = {t: v for t, v in expected.items() if v}
    assert a.entries == b.entries == expected
    a.update({}, source=0, bound=TOP)
    b.update({}, source=0, bound=TOP)
    assert a.watermark == b.watermark == (min(expected) if expected else TOP)


# -- a randomized model of a pipeline ----------------------------------------------------


class Model:
    """Sources -> ``depth`` levels of workers, batches with random 64-bit ids.

    Workers (and sources) accumulate XORs locally and flush them to the acker at
    random moments; a source's flush carries the bound that covers it. Every
    element is "unprocessed" from its emission until its receiver processed it,
    and every element a source has not emitted yet is unprocessed too.
    """

    def __init__(self, times_per_source, depth, rng, id_rng):
        self.rng, self.id_rng = rng, id_rng
        self.pending = [list(ts) for ts in times_per_source]  # not yet emitted, sorted
        self.source_buf = [{} for _ in times_per_source]
        self.bound = [None for _ in times_per_source]
        self.depth = depth
        self.inflight: list = []  # (level, batch id, times)
        self.worker_buf: list = [{} for _ in range(depth)]
        self.acker = Acker(sources=len(times_per_source))
        self.done_sources = set()

    @staticmethod
    def _xor(buf, times, bid):
        for t in set(times):
            buf[t] = buf.get(t, 0) ^ bid

    def earliest_unprocessed(self):
        times = [t for _, _, ts in self.inflight for t in ts]
        times += [p[0] for p in self.pending if p]
        return min(times) if times else None

    def actions(self):
        acts = []
        for s, p in enumerate(self.pending):
            if p:
                acts.append(("emit", s))
            if self.source_buf[s] or (not p and s not in self.done_sources):
                acts.append(("source_flush", s))
        if self.inflight:
            acts.append(("process", None))
        for w, buf in enumerate(self.worker_buf):
            if buf:
                acts.append(("worker_flush", w))
        return acts

    def step(self, act):
        kind, i = act
        rng = self.rng
        if kind == "emit":
            n = rng.randint(1, 3)
            times, self.pending[i] = self.pending[i][:n], self.pending[i][n:]
            bid = self.id_rng.getrandbits(64) or 1
            self._xor(self.source_buf[i], times, bid)
            self.bound[i] = times[-1]
            self.inflight.append((0, bid, times))
        elif kind == "source_flush":
            bound = self.bound[i]
            if not self.pending[i]:
                bound = TOP
                self.done_sources.add(i)
            xors, self.source_buf[i] = self.source_buf[i], {}
            self.acker.update(xors, source=i, bound=bound)  # None before the first emission
        elif kind == "process":
            level, bid, times = self.inflight.pop(rng.randrange(len(self.inflight)))
            buf = self.worker_buf[level]
            self._xor(buf, times, bid)
            if level + 1 < self.depth:
                children = [t for t in times for _ in range(rng.randint(0, 2))]
                if children:
                    cid = self.id_rng.getrandbits(64) or 1
                    self._xor(buf, children, cid)
                    self.inflight.append((level + 1, cid, children))
        else:
            xors, self.worker_buf[i] = self.worker_buf[i], {}
            self.acker.update(xors)


def run_checking_the_watermark(model: "Model") -> None:
    """Take the model's actions in its random order until none is left; after each, the
    watermark has not moved back nor passed the earliest unprocessed time."""
    last = model.acker.watermark
    while True:
        acts = model.actions()
        if not acts:
            return
        model.step(model.rng.choice(acts))
        w = model.acker.watermark
        assert w >= last
        last = w
        earliest = model.earliest_unprocessed()
        if earliest is not None:
            assert not earliest < w, f"watermark {w} passed unprocessed time {earliest}"


@settings(max_examples=150, deadline=None)
@given(
    times=st.lists(st.lists(st.integers(0, 20), max_size=8, unique=True).map(sorted), min_size=1, max_size=3),
    depth=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_watermark_never_exceeds_the_earliest_unprocessed_time(times, depth, seed):
    per_source = [[(ts, s, 0, ts) for ts in tss] for s, tss in enumerate(times)]
    model = Model(per_source, depth, random.Random(seed), random.Random(seed ^ 0x5EED))
    run_checking_the_watermark(model)
    # Everything processed and flushed, every source done: nothing holds the watermark.
    assert model.acker.in_flight() == 0
    assert model.acker.watermark == TOP


@pytest.mark.parametrize("bound", [T(0), T(3, 0, 1), TOP])
def test_source_bound_without_xors(bound):
    a = Acker(sources=1)
    assert a.update({}, source=0, bound=bound) == successor(bound)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8)), max_size=60))
def test_least_bound_kept_as_min_of_bounds(sources, updates):
    """The acker keeps the least bound incrementally (min over the sources per update cost
    O(sources)); after any sequence of bounds, in any order, it is min(bounds) and the
    watermark is its successor."""
    a = Acker(sources=sources)
    for source, k in updates:
        source %= sources
        a.update({}, source=source, bound=T(k))
        assert a._least == min(a.bounds)
        assert a._at_least == a.bounds.count(min(a.bounds))
    if all(b != BOTTOM for b in a.bounds):
        assert a.watermark >= successor(min(a.bounds))
