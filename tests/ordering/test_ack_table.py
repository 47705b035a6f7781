"""The XOR ack table: every id XORed in twice (sent and acked, set and fired, held and moved
on) leaves nothing in flight, whichever order the updates come in."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from driftstream.ordering.ack_table import AckTable
from driftstream.ordering.acker import Acker

TIMES = st.integers(0, 5).map(lambda t: (t, 0, 0, t))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(TIMES, TIMES, st.integers(1, 2**64 - 1)), max_size=20), st.randoms())
def test_each_id_in_and_out_again_leaves_nothing_in_flight(holds, rnd):
    updates = []
    for first, then, x in holds:  # held at first, moved to then, then acked at then
        updates += [("xor", first, x), ("move", first, then, x), ("xor", then, x)]
    rnd.shuffle(updates)  # XOR commutes: any order nets out the same
    table, acker = AckTable(), Acker(sources=0)
    for u in updates:
        if u[0] == "xor":
            table.xor(u[1], u[2])
        else:
            table.move(u[1], u[2], u[3])
        if rnd.random() < 0.3:  # a flush: what the acker folds in
            acker.update(table.drain())
    acker.update(table.drain())
    assert not table and acker.in_flight() == 0


def test_fold_keeps_only_the_times_in_flight_and_says_which_are_new():
    table = AckTable()
    assert table.fold({(1,): 5, (2,): 3}) == [(1,), (2,)]
    assert table.fold({(1,): 5, (2,): 1, (3,): 0}) == []
    assert table == {(2,): 2}
