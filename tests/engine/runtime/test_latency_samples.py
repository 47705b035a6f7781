"""LatencySamples: the C samples of a call (``sampled_times`` in ``barriers/_meta_sort.c``, a
run of equal times once) make the same ``times``, in the same order, as the Python's, at
every stride, for elements and window results; a Meta the C does not take goes to the Python."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.runtime import latency_samples
from driftstream.engine.runtime.latency_samples import LatencySamples, sampled_times
from driftstream.ordering.meta import Meta

native = pytest.mark.skipif(latency_samples.NATIVE is None, reason="the C samples are not built (tests/ordering/test_in_order_path.py says why)")

#: an element (a source's offset) or a window's result (offset -1, its close as the time)
times = st.one_of(st.tuples(st.integers(-3, 40), st.integers(0, 1), st.integers(0, 1), st.integers(0, 40)),
                  st.integers(-40, 4000).map(lambda close: (close, -1, -1, -1)))


def samples(calls, native_module, every, max_samples):
    saved, latency_samples.NATIVE = latency_samples.NATIVE, native_module
    try:
        s = LatencySamples(every=every, max_samples=max_samples)
        for n, call in enumerate(calls):
            s.add(call, now=float(n))
        return list(s.times.items()), s.every
    finally:
        latency_samples.NATIVE = saved


@native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(times, st.integers(0, 2)), max_size=30), max_size=8), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from([4, 16, 1 << 16]))
def test_the_c_samples_are_the_pythons(calls, every, max_samples):
    """Sorted calls (as a release's bundle) and unsorted ones, repeats in runs and apart,
    thinning included (a small max_samples): the same times at the same wall clocks."""
    calls = [[((*t, (child,), False), "payload") for t, child in (sorted(call) if n % 2 else call)] for n, call in enumerate(calls)]
    assert samples(calls, latency_samples.NATIVE, every, max_samples) == samples(calls, None, every, max_samples)


@native
def test_a_run_of_equal_times_is_one_sample_and_an_odd_meta_goes_to_the_python():
    doc = [((5, 0, 1, 7, (i,), False), "w") for i in range(50)]
    assert latency_samples.NATIVE.sampled_times(doc, 1) == [(5, 0, 1, 7)]
    assert sampled_times(doc, 1) == [(5, 0, 1, 7)] * 50
    assert latency_samples.NATIVE.sampled_times([((Meta(1, 0, 0, 2), "named"))], 2) == [(1, 0, 0, 2)]
    odd = [((2**70, 0, 0, 1, (), False), "x")]
    assert latency_samples.NATIVE.sampled_times(odd, 1) is None
    s = LatencySamples()
    s.add(odd, now=3.0)
    assert s.times == {(2**70, 0, 0, 1): 3.0}
