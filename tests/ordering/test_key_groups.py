"""Key groups: every group has exactly one owner at any parallelism, owners hold contiguous
ranges in instance order, and a key's owner follows from its group alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering.key_groups import MAX_MAX_PARALLELISM, GroupRange, KeyGroups, check_max_parallelism
from driftstream.ordering.partitioning import mixed_hash, stable_hash


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4096).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_tile_the_groups_and_agree_with_owner(mp):
    m, n = mp
    groups = KeyGroups(m)
    ranges = [groups.range_of(i, n) for i in range(n)]
    assert ranges[0].start == 0 and ranges[-1].end == m
    for a, b in zip(ranges, ranges[1:]):
        assert a.end == b.start  # contiguous, in instance order
    assert all(len(r) >= 1 for r in ranges)  # n <= m: nobody idles
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1  # balanced
    router = groups.router(n)
    for i, r in enumerate(ranges):
        assert all(router[g] == i == groups.owner(g, n) for g in range(r.start, r.end))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.integers(), st.tuples(st.text(max_size=3), st.integers())), max_size=30),
       st.integers(1, 64), st.integers(1, 64))
def test_a_keys_new_owner_is_an_instance_whose_range_holds_its_group(keys, n1, n2):
    """Rescaling n1 -> n2: each key's group sits in exactly one old and one new range."""
    groups = KeyGroups(64)
    for key in keys:
        g = groups.group_of(key)
        assert g == mixed_hash(key) % 64 and KeyGroups(64, key_hash=1).group_of(key) == stable_hash(key) % 64
        old = [i for i in range(n1) if g in groups.range_of(i, n1)]
        new = [i for i in range(n2) if g in groups.range_of(i, n2)]
        assert old == [groups.owner(g, n1)] and new == [groups.owner(g, n2)]


def test_group_range_overlap_and_membership():
    assert GroupRange(0, 4).overlap(GroupRange(4, 8)) == GroupRange(4, 4) and len(GroupRange(4, 4)) == 0
    assert 3 in GroupRange(0, 4) and "3" not in GroupRange(0, 4)
    assert str(GroupRange(43, 86)) == "43-85"


@pytest.mark.parametrize("bad", [0, -1, MAX_MAX_PARALLELISM + 1, 1.5, "128", True])
def test_max_parallelism_outside_its_range_is_refused(bad):
    with pytest.raises(ValueError, match="max_parallelism must be an int from 1 to 32768"):
        check_max_parallelism(bad)


def test_a_parallelism_above_max_parallelism_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="above the flow's max_parallelism 4.*Flow\\(name, max_parallelism=...\\)"):
        KeyGroups(4).router(5)


@pytest.mark.parametrize("prefix", ["k", "user", "key-", "p", "customer-"])
def test_keys_that_differ_in_a_digit_spread_over_the_instances(prefix):
    """Key hash 1 (a bare CRC-32) sent all of k0..k9 to one instance of two (and one of
    four): CRC is linear, and the owner is read from bits the last digit does not reach."""
    keys = [f"{prefix}{i}" for i in range(40)]
    for parallelism in (2, 4):
        owners = [KeyGroups().owner(KeyGroups().group_of(k), parallelism) for k in keys]
        assert len(set(owners)) == parallelism and max(map(owners.count, owners)) <= 0.75 * len(keys), owners
    old = KeyGroups(key_hash=1)
    assert len({old.owner(old.group_of(k), 2) for k in keys[:10]}) == 1  # the defect, kept for snapshots that use it
