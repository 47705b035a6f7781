"""ReadSize: a read's records make about WORK_PER_READ items of work, within [MIN_READ, batch_size]."""

from __future__ import annotations

from hypothesis import given, strategies as st

from driftstream.engine.runtime.read_size import MIN_READ, WORK_PER_READ, ReadSize


def test_before_any_read_it_asks_for_the_batch_size():
    assert ReadSize(256).next == 256


def test_a_read_of_records_that_fan_out_makes_the_next_read_smaller_in_proportion():
    size = ReadSize(256)
    size.made(256, 256 * 128)
    assert size.next == WORK_PER_READ // 128


def test_it_follows_a_change_of_records_within_a_few_reads():
    size = ReadSize(256)
    size.made(256, 256 * 128)
    for _ in range(10):
        size.made(size.next, size.next * 2)
    assert size.next == 256


def test_an_empty_read_changes_nothing():
    size = ReadSize(64)
    size.made(0, 0)
    assert size.next == 64 and size.per_record is None


@given(st.integers(1, 1024), st.lists(st.tuples(st.integers(0, 500), st.integers(0, 10**6)), max_size=20))
def test_the_next_read_stays_within_its_bounds(batch_size, reads):
    size = ReadSize(batch_size)
    for records, work in reads:
        size.made(records, work)
        assert min(batch_size, MIN_READ) <= size.next <= batch_size
