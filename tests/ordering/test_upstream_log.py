"""UpstreamLog: what a sender re-sends to a replacement is every item it sent to that receiver
at or after the last trim, in the order sent, whatever incarnation of the receiver took it."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from driftstream.ordering.upstream_log import UpstreamLog


def item(ts, payload="p", tomb=False):
    return ((ts, 0, 0, ts, (), tomb), payload, "k")


def test_replay_is_what_was_sent_at_or_after_the_trim_per_entry_in_order():
    log = UpstreamLog()
    log.record((1, 0), 4, [item(1), item(5)])
    log.record((1, 1), 4, [item(2)])
    log.record((1, 0), 6, [item(3, "x")])
    log.record((1, 0), 4, [item(5, tomb=True), item(7)])
    log.trim((3, 0, 0, 3))
    assert log.replay((1, 0)) == {4: [item(5), item(5, tomb=True), item(7)], 6: [item(3, "x")]}
    assert log.replay((1, 1)) == {}
    assert len(log) == 4


def test_replay_is_a_copy():
    log = UpstreamLog()
    log.record("r", 1, [item(1)])
    log.replay("r")[1].append(item(2))
    assert log.replay("r") == {1: [item(1)]}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.lists(st.integers(0, 9), max_size=4)), max_size=20),
       st.lists(st.integers(0, 9), max_size=3))
def test_any_sends_and_trims_keep_exactly_the_items_at_or_after_the_last_trim(sends, trims):
    log = UpstreamLog()
    for receiver, entry, times in sends:
        log.record(receiver, entry, [item(t) for t in times])
    for t in sorted(trims):
        log.trim((t, 0, 0, t))
    cut = max(trims, default=-1)
    for receiver in range(3):
        for entry in range(2):
            expected = [item(t) for r, e, times in sends if (r, e) == (receiver, entry) for t in times if t >= cut]
            assert log.replay(receiver).get(entry, []) == expected
