"""Event-time windows: which windows an element belongs to, and when a window closes.

Times here are integers of milliseconds, the unit of an element's source time
(``Meta.ts``: a Kafka record's timestamp, running max per partition; a
MemorySource's element index). Window sizes are given in seconds of event time.

A window ``[start, end)`` of a key *closes* at the global time
``(ceil((end + allowed_lateness) * 1000), -1, -1, -1)`` (:func:`close_time`): above every
element whose source time is below ``end + allowed_lateness``, below every element at
or past it. Whether an element counts in a window or is late for it is therefore a
function of the element alone (its event time and its position t), never of when it
arrived: an element of window W whose source time has reached W's close is late for W.

>>> Tumbling(60).assign(125_000)          # event time 125 s: [120 s, 180 s)
[(120000, 180000)]
>>> Sliding(60, 20).assign(125_000)       # every window of 60 s starting on a multiple of 20 s
[(80000, 140000), (100000, 160000), (120000, 180000)]
>>> close_time(180000, 0.0), close_time(180000, 5.0)
((180000, -1, -1, -1), (185000, -1, -1, -1))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional


def _ms(seconds: float, what: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} is a positive number of seconds, not {seconds!r}")
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"{what} is at least a millisecond (0.001 seconds), not {seconds!r}")
    return ms


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size`` seconds, one starting every ``slide`` seconds (on multiples of
    ``slide`` since time 0); an element is in ``ceil(size / slide)`` of them (fewer when
    ``slide`` does not divide ``size``). Cost of :meth:`assign`: O(windows per element)."""

    size: float
    slide: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "_size_ms", _ms(self.size, "a window's size"))
        object.__setattr__(self, "_slide_ms", _ms(self.slide, "a window's slide"))

    def assign(self, t_ms: int) -> list:
        """The ``(start_ms, end_ms)`` of the windows that hold event time ``t_ms``, oldest first.

        >>> Sliding(10, 4).assign(9_000)
        [(0, 10000), (4000, 14000), (8000, 18000)]
        """
        size, slide = self._size_ms, self._slide_ms
        last = t_ms - t_ms % slide
        first = last - ((size - 1) // slide) * slide
        return [(s, s + size) for s in range(first, last + 1, slide) if s + size > t_ms]


class Tumbling(Sliding):
    """Back-to-back windows of ``size`` seconds: every element is in exactly one.

    >>> Tumbling(0.5).assign(1_250)
    [(1000, 1500)]
    """

    def __init__(self, size: float) -> None:
        super().__init__(size, size)

    def __repr__(self) -> str:
        return f"Tumbling(size={self.size})"


@dataclass(frozen=True)
class Session:
    """Per key, the elements whose event times are less than ``gap`` seconds apart: a
    session ``[first, last + gap)`` closes once the source time passes its end plus the
    allowed lateness; an element within ``gap`` of two sessions merges them.

    >>> Session(30).gap_ms
    30000
    """

    gap: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "gap_ms", _ms(self.gap, "a session's gap"))


def close_time(end_ms: int, allowed_lateness: float) -> tuple:
    """The global time at which a window ending at ``end_ms`` closes (see the module doc)."""
    return (end_ms + math.ceil(allowed_lateness * 1000), -1, -1, -1)


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What a closed window of one key holds: ``value`` is the aggregate (or the list of
    elements, for ``collect``); ``start`` and ``end`` are seconds of event time.

    Slots and a pickle of its fields as a tuple: a sliding count makes a result per key
    per window, each built, pickled to the next stage and loaded there (a frozen dataclass's
    default: 0.97 us to build, 1.9 to pickle and load; these: 0.77 and 1.2).

    >>> import pickle
    >>> pickle.loads(pickle.dumps(WindowResult("k", 0.0, 2.0, 3)))
    WindowResult(key='k', start=0.0, end=2.0, value=3)
    """

    key: Hashable
    start: float
    end: float
    value: Any

    def __reduce__(self) -> tuple:
        return (WindowResult, (self.key, self.start, self.end, self.value))


@dataclass(frozen=True)
class Late:
    """An element that reached a window after it closed (its source time had passed the
    window's end plus the allowed lateness): what ``.late(sink)`` receives."""

    key: Hashable
    element: Any
    event_time: float


@dataclass(frozen=True)
class WindowSpec:
    """A windowed aggregation, as the runtime needs it.

    ``step(state, x) -> (state, None)`` folds one element into a window's state (None
    before its first element); ``result(state)`` is the window's value when it closes;
    ``timestamp(x)`` is an element's event time in seconds (None: its source time).
    """

    assigner: Any  # Sliding (Tumbling) or Session
    step: Callable[[Any, Any], tuple]
    result: Callable[[Any], Any]
    timestamp: Optional[Callable[[Any], float]] = None
    allowed_lateness: float = 0.0
    #: a join's: the payloads a closed window emits, ``pairs(key, state) -> [payload, ...]``
    #: (instead of one WindowResult); its inputs are two sides, and ``step`` folds ``(side, x)``
    pairs: Optional[Callable[[Hashable, Any], list]] = None
    #: ``combine(a, b)``: the state of two windows' elements together, from their states (None:
    #: the aggregate does not combine); a sliding window then folds each element once, into its
    #: pane (:mod:`.paned_windows`)
    combine: Optional[Callable[[Any, Any], Any]] = None


@dataclass(frozen=True)
class IntervalJoinSpec:
    """``KeyedStream.join(other, interval=(lower, upper), how=...)``, in ms of source time."""

    lower_ms: int
    upper_ms: int
    how: str = "inner"
