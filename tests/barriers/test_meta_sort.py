"""The barrier's sort in C (``barriers/_meta_sort.c``) against ``list.sort(key=meta)``, the
reference: the same order for any Metas, ties (equal Metas) in the order they came, a list
of two sorted runs (a merge of the barrier's runs); a list it does not take is left as it
was for the Python to sort. Its ``lower_bounds`` against ``bisect_left``."""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.barriers import barrier
from driftstream.barriers.barrier import Barrier, sort_pairs
from driftstream.ordering.meta import Meta

native = pytest.mark.skipif(barrier.NATIVE is None, reason="the C sort is not built (tests/ordering/test_in_order_path.py says why)")

ints = st.sampled_from([-(2**40), -5, -1, 0, 1, 2, 3, 2**30 - 1, 2**30, 2**31, 2**62])
metas = st.tuples(ints, st.integers(0, 2), st.integers(0, 2), ints, st.lists(ints, max_size=4).map(tuple), st.booleans())


def c_sorted(pairs):
    out = list(pairs)
    assert barrier.NATIVE.sort_pairs(out) is True
    return out


@native
@settings(max_examples=300, deadline=None)
@given(st.lists(metas, max_size=120), st.booleans())
def test_the_c_order_is_pythons(ms, namedtuples):
    """Payloads number the pairs, so a tie in another order than they came would show."""
    pairs = [(Meta(*m) if namedtuples and i % 3 == 0 else m, i) for i, m in enumerate(ms)]
    assert c_sorted(pairs) == sorted(pairs, key=itemgetter(0))


@native
@settings(max_examples=100, deadline=None)
@given(st.lists(metas, max_size=200), st.lists(metas, max_size=200))
def test_two_sorted_runs_merge_as_pythons(a, b):
    pairs = sorted(((m, ("a", i)) for i, m in enumerate(a)), key=itemgetter(0)) + \
        sorted(((m, ("b", i)) for i, m in enumerate(b)), key=itemgetter(0))
    assert c_sorted(pairs) == sorted(pairs, key=itemgetter(0))


@native
@pytest.mark.parametrize("odd", [(2**70, 0, 0, 0, (), False), (True, 0, 0, 0, (), False), (1, 0, 0, 1, tuple(range(7)), False),
                                 (1, 0, 0, 1, (), 0), (3, 0, 0, 3, [2], False), (1, 0, 0, 1), (1.5, 0, 0, 1, (), False)])
def test_a_meta_it_does_not_take_leaves_the_list_to_python(odd):
    pairs = [((5, 0, 0, 5, (), False), "b"), (odd, "odd"), ((1, 0, 0, 1, (), False), "a")]
    untouched = list(pairs)
    assert barrier.NATIVE.sort_pairs(pairs) is False and pairs == untouched
    sort_pairs(pairs)  # the Python sorts it
    assert pairs == sorted(untouched, key=itemgetter(0))


@native
@settings(max_examples=300, deadline=None)
@given(st.lists(metas, max_size=80), st.lists(metas, max_size=12))
def test_lower_bounds_are_bisect_lefts(ready, settled):
    pairs = sorted(((m, i) for i, m in enumerate(ready)), key=itemgetter(0))
    settled = sorted(set(settled))
    keys = [m for m, _ in pairs]
    assert barrier.NATIVE.lower_bounds(pairs, settled) == [bisect_left(keys, m) for m in settled]
    odd = (2**70, 0, 0, 0, (), False)  # past 64 bits: the C takes it only if it never looks at it
    assert barrier.NATIVE.lower_bounds(pairs + [(odd, "odd")], settled) in (None, [bisect_left(keys + [odd], m) for m in settled])
    assert barrier.NATIVE.lower_bounds(pairs, [odd]) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(metas, st.integers(0, 3)), max_size=150), st.lists(st.integers(-(2**40), 2**31), max_size=6))
def test_a_barrier_releases_the_same_with_and_without_the_c(items, cuts):
    """Elements (tombstones too) added between releases at rising watermarks: the same bundles
    with the C sort and with list.sort."""
    out = []
    for native_sort in (barrier.NATIVE, None):
        saved, barrier.NATIVE = barrier.NATIVE, native_sort
        try:
            b, got = Barrier(), []
            chunks = [items[i::len(cuts) + 1] for i in range(len(cuts) + 1)]
            for chunk, w in zip(chunks, sorted(cuts) + [2**63]):
                b.add_many([(m, p, None) for m, p in chunk])
                got.append(b.release((w,)).elements)
            out.append((got, b.tombstones_released))
        finally:
            barrier.NATIVE = saved
    assert out[0] == out[1]


@native
def test_split_items_is_the_comprehensions_split_and_leaves_odd_items_to_it():
    items = [((1, 0, 0, 1, (), False), "a", "k"), ((2, 0, 0, 2, (), True), "b", "k"), ((3, 0, 0, 3, (0,), False), "c", None)]
    assert barrier.NATIVE.split_items(items) == ([((1, 0, 0, 1, (), False), "a"), ((3, 0, 0, 3, (0,), False), "c")], [items[1]])
    assert barrier.NATIVE.split_items([]) == ([], [])
    for odd in (((1, 0, 0, 1, (), 0), "int flag", None), ((1, 0, 0, 1, (), False), "two"), ((1, 0, 0, 1), "short meta", None)):
        assert barrier.NATIVE.split_items(items + [odd]) is None
    b = Barrier()  # an int flag: the comprehension takes it (0 is an element, 1 a tombstone)
    b.add_many([((1, 0, 0, 1, (), 0), "x", None), ((1, 0, 0, 1, (), 1), "x", None), ((2, 0, 0, 2, (), 0), "y", None)])
    assert [p for _, p in b.release((9,)).elements] == ["y"]
