"""The output log of a step declared deterministic=False: records, durability counts, loading
(a later entry for an input replaces an earlier one), settling, and the segments' names."""

from __future__ import annotations

from hypothesis import given, strategies as st

from driftstream.ordering.meta import Meta
from driftstream.snapshots.output_log import (
    OutputLog, decode_segment, encode_segment, parse_segment_name, segment_name, segments_below, segments_from,
)


def _m(t: int, *ids: int) -> Meta:
    return Meta(t, 0, 0, t, tuple(ids))


def _out(meta: Meta, value: float) -> list:
    return [(meta, value, None)]


def test_durable_counts_what_was_written():
    log = OutputLog()
    log.record(_m(1), _out(_m(1), 0.1))
    log.record(_m(2), _out(_m(2), 0.2))
    entries, upto = log.take_pending()
    assert [m for m, _ in entries] == [_m(1), _m(2)] and upto == 2 and not log.all_durable
    log.record(_m(3), _out(_m(3), 0.3))  # recorded while the first write is on its way
    log.written(upto)
    assert log.durable == 2 and not log.all_durable
    log.written(log.take_pending()[1])
    assert log.all_durable and log.pending == []


def test_replayed_entries_are_not_written_again():
    log = OutputLog()
    log.record(_m(1), _out(_m(1), 0.1), fresh=False)
    assert log.pending == [] and log.appended == 0 and log.emitted == {_m(1): _out(_m(1), 0.1)}


def test_without_a_store_nothing_waits():
    log = OutputLog()
    log.pending = None  # a run without snapshots
    log.record(_m(1), _out(_m(1), 0.1))
    assert log.all_durable and log.retract(_m(1)) == _out(_m(1), 0.1)


def test_load_keeps_what_is_at_or_after_since_and_the_latest_entry_per_input():
    log = OutputLog()
    log.load([(_m(1), _out(_m(1), 1)), (_m(5), _out(_m(5), 5)), (_m(5), _out(_m(5), 6)), (_m(7, 0), [])], since=(5, 0, 0, 5))
    assert log.lookup(_m(1)) is None
    assert log.lookup(_m(5)) == _out(_m(5), 6)
    assert log.lookup(_m(7, 0)) == [] and log.lookup(_m(7)) is None  # a flat map's child is its own input


def test_settle_forgets_what_the_watermark_passed():
    log = OutputLog()
    log.load([(_m(t), _out(_m(t), t)) for t in range(100)], since=None)
    for t in range(100, 200):
        log.record(_m(t), _out(_m(t), t))
    log.settle((150,))
    assert log.lookup(_m(99)) is None and log.retract(_m(149)) is None
    assert log.retract(_m(150)) == _out(_m(150), 150)


def test_a_segment_round_trips():
    entries = [(_m(1), _out(_m(1), {"x": [1, 2]})), (_m(2, 3), [])]
    assert decode_segment(encode_segment(entries)) == [(tuple(m), o) for m, o in entries]


_times = st.tuples(st.one_of(st.integers(-10**12, 10**12), st.floats(-1e9, 1e9, allow_nan=False)), st.integers(0, 9), st.integers(0, 99),
                   st.integers(0, 10**9))


@given(st.lists(_times, min_size=1, max_size=5), st.integers(0, 2**63), st.integers(0, 999), st.integers(0, 10**6), _times)
def test_a_segment_name_says_its_largest_time(times, written_ns, instance, seq, cut):
    entries = [(Meta(*t), []) for t in times]
    name = segment_name(written_ns, instance, seq, entries)
    parsed = parse_segment_name(name)
    assert parsed == (written_ns, instance, seq, max(times))
    # a trim below ``cut`` takes it only if every time in it is below; a restore from ``cut`` reads it otherwise
    assert (segments_below([name], cut) == [name]) == all(t < cut for t in times)
    assert (segments_from([name], cut) == [name]) == any(t >= cut for t in times)


def test_segments_are_read_in_the_order_they_were_written_and_strangers_are_ignored():
    a = segment_name(5, 1, 0, [(_m(3), [])])
    b = segment_name(10, 0, 0, [(_m(1), [])])
    c = segment_name(5, 0, 9, [(_m(2), [])])
    assert segments_from([b, a, ".tmp-x", "notes.txt", c], since=None) == [c, a, b]
