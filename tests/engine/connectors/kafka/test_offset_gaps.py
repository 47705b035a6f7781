"""OffsetGaps: a reader fetching from a broker that makes batches visible out of order
still delivers every offset once, in order (pure logic, a simulated broker of one-record
batches)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.engine.connectors.kafka.offset_gaps import OffsetGaps


def _read(visible_at: dict, n: int, wait_s: float, max_records: int, steps: int = 2_000) -> list:
    """Fetch like the source's fetcher: at step ``s`` the broker returns, from the position
    on, the offsets visible by then (``visible_at[offset] <= s``), at most ``max_records``."""
    gaps = OffsetGaps(0, wait_s)
    position, delivered = 0, []
    for step in range(steps):
        batch = [SimpleNamespace(offset=o, next_offset=o + 1) for o in range(position, n) if visible_at.get(o, steps) <= step][:max_records]
        if not batch:
            continue
        got = gaps.admit(batch, now=float(step))
        delivered += [r.offset for r in got]
        position = gaps.refetch_from if gaps.refetch_from is not None else got[-1].next_offset
    return delivered


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.integers(1, 8))
def test_any_visibility_order_delivers_every_offset_in_order(delays, max_records):
    # Offset o becomes visible at step delays[o]: later offsets often before earlier ones.
    visible_at = dict(enumerate(delays))
    assert _read(visible_at, len(delays), wait_s=100.0, max_records=max_records) == list(range(len(delays)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=2, max_size=40), st.sets(st.integers(0, 39)), st.integers(1, 8))
def test_a_hole_that_never_fills_is_skipped_after_the_wait(delays, never, max_records):
    # Compaction and transaction markers leave holes for good: everything else still comes, in order.
    never = {o for o in never if o < len(delays)}
    visible_at = {o: d for o, d in enumerate(delays) if o not in never}
    expected = [o for o in range(len(delays)) if o not in never]
    assert _read(visible_at, len(delays), wait_s=30.0, max_records=max_records) == expected


def test_a_jump_is_not_a_hole():
    gaps = OffsetGaps(5, wait_s=10.0)
    gaps.moved_to(100)
    assert [r.offset for r in gaps.admit([SimpleNamespace(offset=100, next_offset=101)], now=0.0)] == [100]
    assert gaps.refetch_from is None and gaps.skipped == 0
