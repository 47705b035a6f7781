"""Latency samples of one stage instance: the wall-clock time at which sampled elements
passed a point (emitted by a source or fired by a window; released to a sink).

An element is sampled when its offset is a multiple of the stride; a window's result,
which has no offset (-1: it is made by the window's close), when its time (the close)
is. The latency of a window result starts at its window's close, and its samples join
on ``(close, -1, -1, -1)``: one per close time, shared by the window's keys. Past ``max_samples``
the stride doubles and every other sample goes, so a flow that runs for days keeps a
bounded, evenly spread sample. Strides are powers of two times the first one at every
point of a run, so the samples of a coarser point are all in a finer one's and emits
and releases still join on their times.

>>> s = LatencySamples(every=1, max_samples=2)
>>> s.add([((1, 0, 0, 1, (), False), "a"), ((2, 0, 0, 2, (), False), "b")], now=5.0); s.times
{(1, 0, 0, 1): 5.0, (2, 0, 0, 2): 5.0}
>>> s.add([((4, 0, 0, 4, (), False), "c")], now=6.0); s.times, s.every
({(2, 0, 0, 2): 5.0, (4, 0, 0, 4): 6.0}, 2)
>>> s.add([((8000, -1, -1, -1, (7, 0), False), "a window's result"), ((9002, -1, -1, -1, (7, 0), False), "another")], now=7.0)
>>> sorted(s.times), s.every
([(4, 0, 0, 4), (8000, -1, -1, -1)], 4)
"""

from __future__ import annotations

from typing import Any

from driftstream.ordering.accelerators import accelerator

#: ``barriers/_meta_sort.c``, whose ``sampled_times`` takes the samples of a call (None where
#: it is not built: the comprehensions below)
NATIVE = accelerator("driftstream.barriers._meta_sort")


class LatencySamples:
    """``times``: ``t[:4]`` -> wall clock, for the sampled elements (a dict the runtime reports as is)."""

    __slots__ = ("times", "every", "max_samples")

    def __init__(self, every: int = 1, max_samples: int = 1 << 16) -> None:
        self.times: dict = {}
        self.every = max(1, every)
        self.max_samples = max_samples

    def add(self, elements: list, now: float) -> None:
        """Sample ``(meta, payload, ...)`` items at ``now``. One C call or one comprehension per
        call (a loop that stamped releases was 7% of Nexmark q1's instances); O(len(elements)),
        plus an amortised O(1) per sample for the thinning."""
        every = self.every
        # In C: a run of equal times (a document's outputs) sliced and hashed once, not per element.
        hits = NATIVE.sampled_times(elements, every) if NATIVE is not None and type(elements) is list else None
        if hits is None:
            hits = sampled_times(elements, every)
        if hits:
            times = self.times
            times.update(dict.fromkeys(hits, now))
            if len(times) > self.max_samples:
                self._thin()

    def _thin(self) -> None:
        """Keep the samples whose offset is a multiple of twice the stride. O(samples), once per doubling."""
        self.every = every = self.every * 2
        times = self.times
        for t in [t for t in times if (t[3] if t[3] >= 0 else t[0]) % every]:
            del times[t]


def sampled_times(elements: Any, every: int) -> list:
    """The times ``t[:4]`` of the sampled ``(meta, ...)`` items (repeats kept): the reference
    of ``sampled_times`` in ``barriers/_meta_sort.c``, which keeps one of each run."""
    if every == 1:  # until the first thinning: every element
        return [item[0][:4] for item in elements]
    # -1 % every is never 0 here: a window's result falls through to its close time
    return [item[0][:4] for item in elements if item[0][3] % every == 0 or (item[0][3] < 0 and item[0][0] % every == 0)]
