"""Window assignment: every window an element is given holds it, and none is missed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from driftstream.ordering.windows import Sliding, Tumbling, close_time


@given(t=st.integers(-10**9, 10**9), size=st.integers(1, 5000), slide=st.integers(1, 5000))
def test_sliding_windows_are_exactly_those_that_hold_the_time(t, size, slide):
    windows = Sliding(size / 1000, slide / 1000).assign(t)
    assert windows == sorted(windows)
    assert all(start <= t < end and end - start == size and start % slide == 0 for start, end in windows)
    # every window start on the grid within (t - size, t] is there
    expected = [s for s in range(t - t % slide - (size // slide + 1) * slide, t + 1, slide) if s + size > t]
    assert [start for start, _ in windows] == expected


@given(t=st.integers(-10**6, 10**6), size=st.integers(1, 5000))
def test_tumbling_gives_one_window(t, size):
    [(start, end)] = Tumbling(size / 1000).assign(t)
    assert start <= t < end and start % size == 0


def test_close_time_sorts_between_the_elements_before_and_after_it():
    close = close_time(2000, 0.5)
    assert (2499, 0, 0, 9) < close < (2500, 0, 0, 0)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True, 0.0001])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="seconds"):
        Tumbling(bad)


@given(end=st.integers(-10**6, 10**6), lateness=st.floats(0, 100, allow_nan=False), ts=st.integers(-10**6, 2 * 10**6),
       rest=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 10**6)))
def test_an_element_is_late_for_a_window_exactly_when_its_time_reaches_the_end_plus_the_lateness(end, lateness, ts, rest):
    """The close time splits elements by their source time alone: below ``end + lateness``
    (milliseconds, rounded up) they count, at or past it they are late."""
    element = (ts, *rest)
    assert (element < close_time(end, lateness)) == (ts < end + math.ceil(lateness * 1000))
