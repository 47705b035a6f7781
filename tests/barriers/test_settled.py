"""SettledCount through a Barrier: the count below a snapshot's T is exact however the
releases fall around T (a bundle in flight at the marker, replayed output dropped,
tombstones), and a sink of dead letters counts them per failing step."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from driftstream.barriers.barrier import Barrier
from driftstream.ordering.meta import Meta


def M(ts, tombstone=False):
    return Meta(ts, 0, 0, ts, (), tombstone)


def test_elements_held_by_a_bundle_in_flight_at_the_marker_count_below_t():
    b = Barrier()
    for ts in (1, 2, 3, 6, 7):
        b.add(M(ts), ts)
    b.release((2,))          # a bundle in flight: 3 waits although the watermark reaches 5
    b.settled.mark((5,))
    b.release((8,))          # the next release holds 3 (below T) and 6, 7 (above)
    assert b.settled.take_mark((5,)) == {None: 3} and b.settled.total() == 5
    assert b.settled.take_mark((5,)) is None  # taken once


def test_replayed_output_the_sink_held_counts_as_settled_and_cancelled_elements_do_not():
    b = Barrier()
    b.skip_through(M(3))     # after a recovery the sink holds up to 3
    for ts in (2, 3, 4, 5):
        b.add(M(ts), ts)
    b.add(M(5, tombstone=True), 5)  # takes 5 back
    b.settled.mark((4,))
    b.release((9,))
    assert b.released == 1 and b.dropped_replayed == 2
    assert b.settled.take_mark((4,)) == {None: 2} and b.settled.total() == 3


def test_a_sink_of_dead_letters_counts_them_per_step():
    b = Barrier()
    b.settled.decide = lambda first: (lambda p: p[0])  # a payload's step: its first field
    for ts, step in ((1, "parse"), (2, "window"), (3, "parse")):
        b.add(M(ts), (step, ts))
    b.settled.mark((3,))
    b.release((4,))
    assert b.settled.take_mark((3,)) == {"parse": 1, "window": 1}
    assert b.settled.counts == {"parse": 2, "window": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.lists(st.integers(1, 45), min_size=1, max_size=8),
       st.integers(0, 45), st.sets(st.integers(0, 7), max_size=8))
def test_the_count_below_t_is_the_elements_below_t_whatever_the_release_pattern(times, watermarks, t, deferred):
    # Releases at rising watermarks; some are skipped (a bundle in flight), as SinkRelease
    # skips them; a mark opens at watermark t. Its count is the elements below t.
    b = Barrier()
    for ts in times:
        b.add(M(ts), ts)
    marked = False
    for i, w in enumerate(sorted(watermarks)):
        if not marked and w >= t:
            b.settled.mark((t,))
            marked = True
        if i not in deferred:
            b.release((w,))
    if not marked:
        b.settled.mark((t,))
    b.release((46,))
    assert b.settled.take_mark((t,)) == ({None: sum(1 for ts in times if ts < t)} if any(ts < t for ts in times) else {})
