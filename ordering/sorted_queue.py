"""A priority queue for items pushed nearly in order: O(1) for the in-order ones.

Drifting keyed state tracks the first Meta of every key's log, to fold each key once
the watermark passes it. Those heads are pushed in arrival order, which in a backlog
with aligned sources is nearly t order: a binary heap pays O(log n) tuple comparisons
for every push and pop (5 µs a pop with 30,000 keys in flight, a tenth of the index's
fold), a FIFO pays nothing. So items pushed at or after the newest pushed so far go to
a deque, the others to a heap, and :meth:`pop_below` merges the two.

>>> q = SortedQueue()
>>> for t, key in [((1,), "a"), ((3,), "b"), ((2,), "c"), ((5,), "d")]:
...     q.push(t, key)
>>> list(q.pop_below((4,))), len(q)
(['a', 'c', 'b'], 1)

Costs: :meth:`push` O(1) when its t is at or after the last in-order push, else
O(log h) for h items in the heap; :meth:`pop_below` O(1) per item from the deque,
O(log h) per item from the heap.

``SortedQueue`` is the C type of ``ordering/_sorted_queue.c`` where it is built (the same
algorithm and order of ties, without a generator step and a method frame per item: 5-7%
of an index instance in a backlog); :class:`PythonSortedQueue` is the reference.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count
from typing import Any, Hashable, Iterator

from .accelerators import accelerator


class PythonSortedQueue:
    """``(t, item)`` pairs, popped in t order (ties in any order)."""

    __slots__ = ("_fifo", "_heap", "_seq")

    def __init__(self) -> None:
        self._fifo: deque = deque()  # (t, item), t non-decreasing
        self._heap: list = []  # (t, seq, item): seq keeps items out of the comparisons
        self._seq = count()

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def push(self, t: Any, item: Hashable) -> None:
        """Queue ``item`` at ``t``.

        >>> q = PythonSortedQueue(); q.push((2,), "x"); q.push((1,), "y"); list(q.pop_below((9,)))
        ['y', 'x']
        """
        fifo = self._fifo
        if not fifo or fifo[-1][0] <= t:
            fifo.append((t, item))
        else:
            heapq.heappush(self._heap, (t, next(self._seq), item))

    def pop_below(self, bound: Any) -> Iterator[Hashable]:
        """Take out and yield, in t order, every item whose t is below ``bound``. Items pushed
        while iterating are seen if they are below ``bound`` too.

        >>> q = PythonSortedQueue(); q.push((1,), "x"); q.push((7,), "y"); list(q.pop_below((5,))), len(q)
        (['x'], 1)
        """
        fifo, heap = self._fifo, self._heap
        while True:
            if fifo and fifo[0][0] < bound and (not heap or fifo[0][0] <= heap[0][0]):
                yield fifo.popleft()[1]
            elif heap and heap[0][0] < bound:
                yield heapq.heappop(heap)[2]
            else:
                return


_native = accelerator("driftstream.ordering._sorted_queue")
#: the C queue where it is built, else the Python
SortedQueue = PythonSortedQueue if _native is None else _native.SortedQueue
