"""PartitionClock: a partition's time from its records' timestamps, bounded against one far-off clock."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.engine.connectors.partition_clock import PartitionClock

JUMP = 1_000

timestamps = st.lists(st.one_of(st.integers(0, 5_000), st.integers(10**9, 10**9 + 3_000)), max_size=40)


def stamps(ts_list: list, start_ts=None, jump=JUMP, bounded: bool = True) -> list:
    clock = PartitionClock(start_ts, jump)
    out = [pair for i, t in enumerate(ts_list) for pair in clock.offer(t, i)]
    return out + (clock.finish() if bounded else [])


@settings(max_examples=300, deadline=None)
@given(timestamps)
def test_every_record_is_stamped_once_in_order_and_time_never_goes_back(ts_list):
    out = stamps(ts_list)
    assert [i for i, _ in out] == list(range(len(ts_list)))
    assert [s for _, s in out] == sorted(s for _, s in out)


@settings(max_examples=300, deadline=None)
@given(timestamps, st.data())
def test_a_replay_from_any_saved_position_gives_the_same_stamps(ts_list, data):
    """The position saved at a snapshot: the first record not released (the held one, if any)
    and the clock's time. A clock started there stamps the rest as the first did."""
    full = stamps(ts_list)
    cut = data.draw(st.integers(0, len(ts_list)))
    clock = PartitionClock(None, JUMP)
    for i, t in enumerate(ts_list[:cut]):
        clock.offer(t, i)
    start = clock.held if clock.holding else cut
    assert stamps(ts_list[start:], clock.ts) == [(i - start, s) for i, s in full[start:]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, JUMP // 10), min_size=2, max_size=30).map(lambda d: list(accumulate(d))), st.data())
def test_one_far_off_record_among_steady_ones_is_clamped_and_changes_no_other_stamp(ts_list, data):
    at = data.draw(st.integers(1, len(ts_list) - 1))  # not the last: the next record judges it
    far = data.draw(st.sampled_from([10**12, ts_list[at - 1] + 50 * JUMP]))
    with_it = stamps(ts_list[:at] + [far] + ts_list[at:])
    without = stamps(ts_list)
    assert [s for i, s in with_it if i != at] == [s for _, s in without]
    assert dict(with_it)[at] == ts_list[at - 1]  # the partition's time when it came


def test_a_jump_that_the_next_record_confirms_moves_time():
    assert stamps([10, 20, 50_000, 50_001]) == [(0, 10), (1, 20), (2, 50_000), (3, 50_001)]


def test_a_far_off_first_record_is_judged_by_the_second():
    clock = PartitionClock(None, JUMP)
    assert clock.offer(10**12, "bad") == []
    assert clock.offer(7, "good") == [("bad", 7), ("good", 7)]
    assert clock.clamped == 1


def test_without_a_bound_it_is_the_running_maximum():
    assert stamps([5, 3, 10**12, 4], jump=None) == [(0, 5), (1, 5), (2, 10**12), (3, 10**12)]


def test_a_held_record_at_the_end_of_a_bounded_partition_keeps_its_timestamp():
    assert stamps([10, 10**12]) == [(0, 10), (1, 10**12)]
    assert stamps([10, 10**12], bounded=False) == [(0, 10)]
