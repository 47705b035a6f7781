"""SortedQueue: whatever the push order, pop_below yields exactly the items below the bound, in t order;
the C queue (``ordering/_sorted_queue.c``) pops exactly what the Python pops, in the same order."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driftstream.ordering import sorted_queue
from driftstream.ordering.sorted_queue import PythonSortedQueue

QUEUES = [PythonSortedQueue] + ([] if sorted_queue._native is None else [sorted_queue._native.SortedQueue])


@pytest.mark.parametrize("SortedQueue", QUEUES)
@given(pushes=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3))), bounds=st.lists(st.integers(0, 60), max_size=4))
def test_pops_in_t_order_whatever_the_push_order(SortedQueue, pushes: list, bounds: list) -> None:
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


@pytest.mark.parametrize("SortedQueue", QUEUES)
def test_an_item_pushed_while_popping_is_popped_if_below_the_bound(SortedQueue) -> None:
    q = SortedQueue()
    q.push((1,), "a")
    out = []
    for item in q.pop_below((5,)):
        out.append(item)
        if item == "a":
            q.push((3,), "b")  # a key whose log still has a head below the bound
            q.push((7,), "c")
    assert out == ["a", "b"] and len(q) == 1


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 30), st.integers(0, 2)),
    st.tuples(st.just("pop"), st.integers(0, 35), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2)), max_size=3)),
), max_size=80)


@pytest.mark.skipif(sorted_queue._native is None, reason="the C queue is not built (tests/ordering/test_in_order_path.py says why)")
@given(ops=ops)
def test_the_c_queue_pops_what_the_python_pops_in_the_same_order(ops) -> None:
    """Ties included (equal t, the same item twice), and pushes while a pop runs (an advance
    pushes a key's next head), some of them below the bound."""
    queues = [PythonSortedQueue(), sorted_queue._native.SortedQueue()]
    popped: list = [[], []]
    for n, op in enumerate(ops):
        for q, out in zip(queues, popped):
            if op[0] == "push":
                q.push((op[1],), (op[2], n % 3))
                continue
            later = list(op[2])
            for item in q.pop_below((op[1],)):
                out.append(item)
                if later:
                    t, k = later.pop()
                    q.push((t,), ("pushed", k))
            out.append("|")
        assert popped[0] == popped[1] and len(queues[0]) == len(queues[1])
    rest = [list(q.pop_below((99,))) for q in queues]
    assert rest[0] == rest[1] and len(queues[1]) == 0


@pytest.mark.skipif(sorted_queue._native is None, reason="the C queue is not built")
def test_a_t_that_does_not_compare_raises_as_in_python() -> None:
    for q in (PythonSortedQueue(), sorted_queue._native.SortedQueue()):
        q.push((2,), "a")
        q.push((1,), "b")  # into the heap
        with pytest.raises(TypeError):
            q.push(("x",), "c")
        with pytest.raises(TypeError):
            list(q.pop_below(("y",)))


#: Meta-like times, as the C compares them itself (``cmp3``): int or float ts (equal values of
#: either type too), ints past 64 bits, child ids of any length, tombstone bools.
metas = st.tuples(
    st.one_of(st.integers(0, 6), st.integers(0, 6).map(float), st.just(2**70), st.just(2.5)),
    st.integers(0, 1), st.integers(0, 1), st.integers(-1, 2),
    st.lists(st.integers(0, 2), max_size=3).map(tuple), st.booleans(),
)


@pytest.mark.skipif(sorted_queue._native is None, reason="the C queue is not built")
@given(pushes=st.lists(metas, max_size=60), bounds=st.lists(metas, max_size=4))
def test_the_c_queue_orders_metas_as_python_compares_them(pushes: list, bounds: list) -> None:
    queues = [PythonSortedQueue(), sorted_queue._native.SortedQueue()]
    popped: list = [[], []]
    for q, out in zip(queues, popped):
        for n, t in enumerate(pushes):
            q.push(t, n)
        for bound in sorted(bounds) + [(float("inf"),)]:
            out.append(list(q.pop_below(bound)))
    assert popped[0] == popped[1]
    ts = [pushes[n] for n in popped[1][-1]]
    assert ts == sorted(ts)  # the last pop takes everything left, in Python's order of the tuples
