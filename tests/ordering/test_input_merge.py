"""The input merge: every item is released once, an offer's token only after all its items,
and while every sender stays active the items leave in t order whatever the interleaving."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.ordering.input_merge import InputMerge


@st.composite
def senders_and_arrivals(draw):
    """2-4 senders, each a sorted run of distinct times cut into batches, and an arrival
    order that keeps each sender's batches in order (one connection each is FIFO)."""
    n = draw(st.integers(2, 4))
    times = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=200, unique=True))
    owner = draw(st.lists(st.integers(0, n - 1), min_size=len(times), max_size=len(times)))
    batches = []
    for s in range(n):
        mine = sorted(t for t, o in zip(times, owner) if o == s)
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(mine) - 1)), max_size=5))) if len(mine) > 1 else []
        edges = [0, *cuts, len(mine)]
        batches.append([[((t,), f"s{s}") for t in mine[a:b]] for a, b in zip(edges, edges[1:]) if b > a])
    order = draw(st.permutations([s for s in range(n) for _ in batches[s]]))
    return batches, order


def _deliver(batches, order, more: bool, step: float):
    merge = InputMerge(quiet_s=0.002, max_hold_s=10.0)
    cursor = [0] * len(batches)
    released, tokens, now = [], [], 0.0
    for k, s in enumerate(order):
        items = batches[s][cursor[s]]
        cursor[s] += 1
        last = cursor[s] == len(batches[s])
        merge.offer(s, 0, items, (s, cursor[s]), now, more=more and not last)
        got, done = merge.take(now)
        released += got.get(0, [])
        tokens += done
        now += step
    got, done = merge.take_all()
    return released + got.get(0, []), tokens + done, merge


@given(senders_and_arrivals())
@settings(max_examples=300, deadline=None)
def test_every_item_once_and_tokens_after_their_items(case):
    batches, order = case
    for more, step in ((True, 0.0), (False, 0.0), (False, 0.01), (True, 0.01)):
        released, tokens, merge = _deliver(batches, order, more, step)
        everything = sorted(item for runs in batches for run in runs for item in run)
        assert sorted(released) == everything
        assert sorted(tokens) == sorted((s, i + 1) for s, runs in enumerate(batches) for i in range(len(runs)))
        assert not merge.holding


@given(senders_and_arrivals())
@settings(max_examples=300, deadline=None)
def test_while_every_sender_has_more_the_items_leave_in_t_order(case):
    # A sender not heard from yet holds nobody back (the merge does not know it exists):
    # each says hello first, with a time below every other.
    batches, order = case
    hellos = [[[((-1 - s,), "hello")]] + runs for s, runs in enumerate(batches)]
    released, _, _ = _deliver(hellos, list(range(len(batches))) + list(order), more=True, step=0.0)
    times = [m for m, p in released if p != "hello"]
    assert times == sorted(times)


def test_a_quiet_sender_does_not_hold_the_others():
    merge = InputMerge(quiet_s=0.002, max_hold_s=1.0)
    merge.offer("A", 0, [((1,), "a1")], "A1", now=0.0)
    merge.offer("B", 0, [((5,), "b5")], "B1", now=0.0)
    assert merge.take(0.0) == ({0: [((1,), "a1")]}, ["A1"])  # b5 waits for A
    assert merge.take(0.001) == ({}, [])
    assert merge.take(0.003) == ({0: [((5,), "b5")]}, ["B1"])  # A quiet for 3 ms: b5 goes


def test_a_sender_with_more_holds_the_others_up_to_max_hold():
    merge = InputMerge(quiet_s=0.002, max_hold_s=0.5)
    merge.offer("A", 0, [((1,), "a1")], "A1", now=0.0, more=True)
    merge.offer("B", 0, [((5,), "b5")], "B1", now=0.0)
    merge.take(0.0)
    assert merge.take(0.4) == ({}, [])
    assert merge.take(0.6) == ({0: [((5,), "b5")]}, ["B1"])
