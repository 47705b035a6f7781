"""Meta, the total order t(x): global time, then child_ids (parent first), then tombstone;
comparison against a 4-tuple watermark; the JSON round trip; ``successor``."""

from __future__ import annotations

import functools
import json

from hypothesis import given, settings, strategies as st

from driftstream.ordering.meta import BOTTOM, TOP, Meta, meta_from_json, successor

small = st.integers(0, 3)
times = st.tuples(st.integers(-2, 3), small, small, small)
child_ids = st.lists(st.integers(0, 2), max_size=3).map(tuple)
metas = st.builds(lambda t, c, tomb: Meta(*t, c, tomb), times, child_ids, st.booleans())
watermarks = st.one_of(times, st.just(BOTTOM), st.just(TOP), st.integers(-3, 4).map(lambda ts: (ts,)))

FAST = settings(max_examples=200, deadline=None)


def reference_cmp(a: Meta, b: Meta) -> int:
    """The documented order, spelled out field by field (independent of tuple order)."""
    for x, y in zip((a.ts, a.source, a.partition, a.offset), (b.ts, b.source, b.partition, b.offset)):
        if x != y:
            return -1 if x < y else 1
    # child_ids lexicographically, a prefix (the parent) before its extensions.
    for x, y in zip(a.child_ids, b.child_ids):
        if x != y:
            return -1 if x < y else 1
    if len(a.child_ids) != len(b.child_ids):
        return -1 if len(a.child_ids) < len(b.child_ids) else 1
    if a.tombstone != b.tombstone:
        return 1 if a.tombstone else -1  # the tombstone sorts after its invalidee
    return 0


@FAST
@given(metas, metas)
def test_order_matches_the_documented_order(a, b):
    c = reference_cmp(a, b)
    assert (a < b) == (c < 0)
    assert (a == b) == (c == 0)
    assert (a > b) == (c > 0)


@FAST
@given(st.lists(metas, max_size=12))
def test_sorting_agrees_with_the_reference_order(ms):
    assert sorted(ms) == sorted(ms, key=functools.cmp_to_key(reference_cmp))


def test_global_time_dominates_child_ids_and_tombstone():
    early = Meta(1, 9, 9, 9, (9, 9), True)
    late = Meta(2, 0, 0, 0)
    assert early < late
    assert Meta(1, 0, 0, 5) < Meta(1, 0, 1, 0) < Meta(1, 1, 0, 0)


def test_parent_sorts_before_its_children_and_children_in_index_order():
    p = Meta(5, 0, 1, 5)
    assert p < p.child(0) < p.child(0).child(0) < p.child(0).child(1) < p.child(1) < p.child(10)
    assert p.child(1).child(0).child_ids == (1, 0)
    assert p.child(2).child_ids == (2,)


def test_tombstone_sorts_right_after_its_invalidee():
    m = Meta(3, 0, 0, 3, (1,))
    t = m.as_tombstone()
    assert t.tombstone and not m.tombstone
    assert m < t
    # Nothing fits between an element and its tombstone except the element's own children.
    assert t < Meta(3, 0, 0, 3, (2,))
    assert t < Meta(3, 0, 0, 4)
    assert Meta(3, 0, 0, 3, (0, 9)) < m


@FAST
@given(metas)
def test_tombstone_and_invalidee_are_inverse(m):
    t = m.as_tombstone()
    assert t.tombstone is True
    assert t.invalidee() == m._replace(tombstone=False)
    assert t.invalidee().tombstone is False
    assert t.time == m.time and t.child_ids == m.child_ids
    assert m.invalidee().as_tombstone() == t


@FAST
@given(metas, st.integers(0, 5))
def test_child_keeps_time_and_tombstone_and_appends_k(m, k):
    c = m.child(k)
    assert c.time == m.time
    assert c.child_ids == m.child_ids + (k,)
    assert c.tombstone == m.tombstone
    assert isinstance(c, Meta)


@FAST
@given(metas, watermarks)
def test_meta_is_below_a_watermark_iff_its_global_time_is(m, w):
    assert (m < w) == (m.time < w)
    assert (m >= w) == (not m.time < w)


def test_meta_against_watermark_examples():
    m = Meta(5, 0, 1, 5, (3,), True)
    assert m < (5, 0, 1, 6)
    assert not m < (5, 0, 1, 5)  # a watermark equal to the time has not settled it
    assert m >= (5, 0, 1, 5)
    assert m < (6,) and not m < (5,)
    assert m < TOP and not m < BOTTOM
    assert BOTTOM < m < TOP


def test_time_is_the_first_four_fields():
    m = Meta(7, 1, 2, 3, (4,), True)
    assert m.time == (7, 1, 2, 3)
    assert type(m.time) is tuple


@FAST
@given(metas)
def test_json_round_trip(m):
    encoded = json.dumps(m.to_json())
    back = meta_from_json(json.loads(encoded))
    assert back == m
    assert isinstance(back, Meta)
    assert type(back.child_ids) is tuple and type(back.tombstone) is bool


@FAST
@given(st.floats(allow_nan=False), child_ids, st.booleans())
def test_json_round_trip_float_ts(ts, c, tomb):
    m = Meta(ts, 0, 1, 2, c, tomb)
    assert meta_from_json(json.loads(json.dumps(m.to_json()))) == m


def test_to_json_shape():
    assert Meta(3, 1, 0, 7, (1, 2), True).to_json() == [3, 1, 0, 7, [1, 2], True]
    assert meta_from_json([3, 1, 0, 7, [], 0]) == Meta(3, 1, 0, 7)


@FAST
@given(times)
def test_successor_is_the_next_time(t):
    s = successor(t)
    assert s > t
    assert s == (t[0], t[1], t[2], t[3] + 1)


@FAST
@given(times, times)
def test_successor_is_the_smallest_time_above(t, u):
    if u > t:
        assert u >= successor(t)
    # A Meta at time t is below successor(t): the bound covers it.
    assert Meta(*t, (1, 2), True) < successor(t)


def test_successor_of_bottom_and_top_is_themselves():
    assert successor(BOTTOM) == BOTTOM
    assert successor(TOP) == TOP
    assert BOTTOM < (0, 0, 0, 0) < TOP
