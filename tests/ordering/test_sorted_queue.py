"""SortedQueue: whatever the push order, pop_below yields exactly the items below the bound, in t order."""

from hypothesis import given
from hypothesis import strategies as st

from driftstream.ordering.sorted_queue import SortedQueue


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3))), st.lists(st.integers(0, 60), max_size=4))
def test_pops_in_t_order_whatever_the_push_order(pushes: list, bounds: list) -> None:
    q, pending = SortedQueue(), []
    for n, (t, shard) in enumerate(pushes):
        q.push((t, shard), n)
        pending.append(((t, shard), n))
    for bound in sorted(bounds) + [100]:
        popped = list(q.pop_below((bound,)))
        expected = [n for t, n in pending if t < (bound,)]
        assert sorted(popped) == sorted(expected)
        ts = [dict((n, t) for t, n in pending)[n] for n in popped]
        assert ts == sorted(ts)
        pending = [(t, n) for t, n in pending if t >= (bound,)]
        assert len(q) == len(pending)


def test_an_item_pushed_while_popping_is_popped_if_below_the_bound() -> None:
    q = SortedQueue()
    q.push((1,), "a")
    out = []
    for item in q.pop_below((5,)):
        out.append(item)
        if item == "a":
            q.push((3,), "b")  # a key whose log still has a head below the bound
            q.push((7,), "c")
    assert out == ["a", "b"] and len(q) == 1
