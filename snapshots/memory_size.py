"""How much memory a decoded state holds, estimated in bounded time: what a state
cache counts against its budget.

``sys.getsizeof`` counts a container's own slots, not what they refer to; a full
walk of a large state (a posting list of a million pages) would cost as much as
copying it. :func:`approx_size` walks at most :data:`SAMPLE` items per container,
:data:`DEPTH` levels deep, and scales the sampled items' sizes up to the
container's length.

>>> approx_size(7) == sys.getsizeof(7)
True
>>> small, large = approx_size(list(range(10))), approx_size(list(range(100_000)))
>>> 400 < small < 600, 3_000_000 < large < 4_000_000
(True, True)

Costs: O(SAMPLE ** DEPTH) at most, whatever the size of the value; exact for flat
values, an estimate (from the first items) for containers longer than SAMPLE.
Shared objects (small ints, interned strings) are counted at each reference, so
it errs on the large side, which is the safe side for a budget.

A state cache counts a state it has not measured at :class:`MeanSize` ``.mean``, the mean
of those it has.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

#: The least memory budget of one state cache (one stateful step instance) by default.
DEFAULT_BUDGET_BYTES = 256 << 20

#: The default budget's share of the node's memory over its cores (:func:`node_budget_bytes`).
NODE_MEMORY_SHARE = 1 / 8

#: Items of a container looked at; longer containers are extrapolated from them.
SAMPLE = 16

#: Bytes counted per cached state beyond its own: its key and the cache's slots for it (measured with
#: tracemalloc, keys (str, int): the slots 140-147 bytes, the key tuple and its int 88).
RECORD_OVERHEAD = 256

#: States measured as they are set until this many have been measured, so that the mean they
#: count at is a real one before the first base writes any.
MEASURE_FIRST = 64

#: A base measures one state in this many of those it writes (see :meth:`MeanSize.sample`).
MEASURE_EVERY = 8

#: Levels of nesting looked into; deeper values count at their own size only.
DEPTH = 3

_getsizeof = sys.getsizeof


def approx_size(value: Any, depth: int = DEPTH) -> int:
    """Bytes ``value`` holds, its contents included (estimated, see the module doc)."""
    size = _getsizeof(value)
    kind = type(value)
    if depth == 0 or kind in _FLAT:
        return size
    # Items that hold nothing more (or at the last level) count at their own size, here
    # rather than in a call each: a base measures every entry it writes (a list of a few
    # ints: 2.0 -> 1.3 us).
    if kind is dict:
        n = len(value)
        if not n:
            return size
        inner = 0
        for i, (k, v) in enumerate(value.items()):
            if i == SAMPLE:
                break
            inner += _getsizeof(k) if depth == 1 or type(k) in _FLAT else approx_size(k, depth - 1)
            inner += _getsizeof(v) if depth == 1 or type(v) in _FLAT else approx_size(v, depth - 1)
        return size + inner * n // min(n, SAMPLE)
    if kind in _SEQUENCES:
        n = len(value)
        if not n:
            return size
        inner = 0
        for i, item in enumerate(value):
            if i == SAMPLE:
                break
            inner += _getsizeof(item) if depth == 1 or type(item) in _FLAT else approx_size(item, depth - 1)
        return size + inner * n // min(n, SAMPLE)
    return size


#: Types whose size is their own (:func:`sys.getsizeof`), with nothing inside to walk.
_FLAT = frozenset({int, float, str, bytes, bool, type(None)})

_SEQUENCES = frozenset({list, tuple, set, frozenset})


_CONTAINERS = frozenset({list, tuple, dict, set, frozenset, str, bytes})


class MeanSize:
    """The mean size of the states measured so far (:func:`approx_size` plus
    :data:`RECORD_OVERHEAD` each): what a state cache counts a state it has not measured at.

    >>> sizes = MeanSize(); sizes.mean == RECORD_OVERHEAD
    True
    >>> sizes.measure([1, 2]) == sizes.mean == RECORD_OVERHEAD + approx_size([1, 2])
    True

    Costs: :meth:`measure` one :func:`approx_size`; ``mean`` O(1).
    """

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    @property
    def mean(self) -> int:
        return self.total // self.count if self.count else RECORD_OVERHEAD

    @property
    def measuring_all(self) -> bool:
        """True until :data:`MEASURE_FIRST` states are measured: until then every state set is,
        so that the mean a state counts at is a real one before the first base."""
        return self.count < MEASURE_FIRST

    def measure(self, state: Any) -> int:
        """The bytes ``state`` holds in a cache (counted in the mean)."""
        size = approx_size(state) + RECORD_OVERHEAD
        self.count += 1
        self.total += size
        return size

    def sample(self, items: list, sizes: dict) -> None:
        """Measure some of a base's ``(key, state)`` into ``sizes`` (key -> bytes): every one
        until :data:`MEASURE_FIRST` are, then one in :data:`MEASURE_EVERY` and every container
        longer than the :data:`SAMPLE` items :func:`approx_size` looks at (measuring each was a
        fifth of a base row's cost). O(items), the sampled ones measured.

        >>> sizes, got = MeanSize(), {}
        >>> sizes.count = MEASURE_FIRST
        >>> sizes.sample([(k, [k]) for k in range(16)] + [("big", list(range(100)))], got)
        >>> sorted(got, key=str)
        [0, 8, 'big']
        """
        every = 1 if self.measuring_all else MEASURE_EVERY
        count, total = 0, 0
        for i, (key, state) in enumerate(items):
            if i % every == 0 or (type(state) in _CONTAINERS and len(state) > SAMPLE):
                size = sizes[key] = approx_size(state) + RECORD_OVERHEAD
                count += 1
                total += size
        self.count += count
        self.total += total


def node_budget_bytes(memory: Optional[int] = None, cores: Optional[int] = None) -> int:
    """The state cache budget of an instance that names none: an eighth of the node's memory
    (its cgroup's limit where lower) over its cores, so a node running about an instance a core
    keeps an eighth of its memory in state caches; at least :data:`DEFAULT_BUDGET_BYTES`. 1.5 GiB
    on a 2-core machine of 24 GiB. The budget changes what stays decoded, never the output.

    >>> node_budget_bytes(memory=24 << 30, cores=2) >> 20
    1536
    >>> node_budget_bytes(memory=1 << 30, cores=8) == DEFAULT_BUDGET_BYTES
    True
    """
    memory = _node_memory() if memory is None else memory
    cores = (os.cpu_count() or 1) if cores is None else cores
    return max(DEFAULT_BUDGET_BYTES, int(memory * NODE_MEMORY_SHARE / max(cores, 1)))


def _node_memory() -> int:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: the floor
        return 0
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            memory = min(memory, int(text))
    return memory
