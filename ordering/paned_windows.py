"""Sliding windows cut into panes: an element is folded once, not once per window it is in.

A sliding window of ``size`` every ``slide`` puts each element into ``size / slide``
windows; :class:`~.windowed_state.WindowedState` folds it into each, through the
drifting keyed state (a log entry, a fold, a snapshot row per window): Nexmark's q5
(10 s every 2 s) spent most of its time there. When the aggregate can combine two
partial states (``WindowSpec.combine``: a count's), the windows are cut into *panes*
of ``gcd(size, slide)``: an element is folded into its pane only, and a window that
closes is the combination of its panes. This is the slicing of Flink SQL's window
aggregates.

What a window holds is unchanged: the elements below its close. An element whose
source time has passed the close of some of its windows but not all (late for the
oldest) cannot go into a pane, which every window over it shares: it is folded
into each window it is still on time for, under the window's own key
``(key, start, end)`` (the layout of :class:`~.windowed_state.WindowedState`, so a
snapshot written by it restores here as such windows), and leaves as a ``Late``.

Panes are keyed ``(key, pane_start, pane_end, PANE)``. A pane goes when the last
window over it has been emitted and the watermark has passed that window's close, as
a window's state does; so every pane of a snapshot at T serves windows closing at or
after T, and :meth:`PanedWindowState.restore_timers` sets the timers of exactly those.

>>> from driftstream.ordering.windows import Sliding, WindowSpec
>>> count = WindowSpec(Sliding(2, 1), step=lambda n, x: ((n or 0) + 1, None), result=lambda n: n,
...                    combine=lambda a, b: a + b)
>>> ws, acks = PanedWindowState(count, seed=1), AckTable()
>>> e = lambda ts: ((ts, 0, 0, ts, (), False), "x", "k")
>>> ws.apply_batch([e(500), e(1500), e(1700)], acks)
[]
>>> ws.advance((2000, -1, -1, -1)); [(r.start, r.end, r.value) for _, r in ws.fire((2000, -1, -1, -1), acks)]
[(-1.0, 1.0, 1), (0.0, 2.0, 3)]
>>> ws.advance((3000, -1, -1, -1)); [(r.start, r.end, r.value) for _, r in ws.fire((3000, -1, -1, -1), acks)]
[(1.0, 3.0, 2)]

Costs: an element is one fold into its pane (what ``stateful_map`` costs) and a timer
check per window; a window that closes reads ``size / pane`` panes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from .ack_table import AckTable
from .meta import BOTTOM
from .windowed_state import _TimedState
from .windows import Sliding, WindowResult, WindowSpec

#: what ``read_view``'s dict gives for a pane it does not hold
_MISSING = object()

#: The last item of a pane's state key (a window's own key has three items).
PANE = 0


def paned(spec: WindowSpec) -> bool:
    """Whether a window step is kept in panes: a sliding window (``slide < size``) whose
    aggregate combines partial states, and no join.

    >>> from driftstream.ordering.windows import Sliding, Tumbling
    >>> plus = lambda a, b: a + b
    >>> paned(WindowSpec(Sliding(10, 2), None, None, combine=plus)), paned(WindowSpec(Tumbling(10), None, None, combine=plus))
    (True, False)
    """
    a = spec.assigner
    return spec.combine is not None and spec.pairs is None and isinstance(a, Sliding) and a._slide_ms < a._size_ms


class PanedWindowState(_TimedState):
    """The sliding windows of every key of one instance, folded in panes; see the module doc."""

    def __init__(self, spec: WindowSpec, backend: Any = None, seed: Optional[int] = None, on_error: Optional[Callable] = None) -> None:
        super().__init__(spec, spec.step, backend, seed, on_error=on_error)
        self.size, self.slide = spec.assigner._size_ms, spec.assigner._slide_ms
        self.pane = math.gcd(self.size, self.slide)
        #: window keys ``(key, start, end)`` with a state of their own (elements late for an older window)
        self._own: set = set()
        #: pane keys whose windows have their timers: the windows over a pane are those of any
        #: element in it, so its first element sets them (one set lookup for the others, not
        #: a timer per window)
        self._timed: set = set()

    def _close(self, end: int) -> tuple:
        return (end + self.lateness_ms, -1, -1, -1)

    def apply_batch(self, items: list, acks: AckTable) -> list:
        """As :meth:`~.windowed_state.WindowedState.apply_batch`: returns the ``Late`` records."""
        assign, pane, lateness = self.spec.assigner.assign, self.pane, self.lateness_ms
        size, slide = self.size, self.slide
        set_timer, timed, feed, out = self._set_timer, self._timed, [], []
        by_source_time = self.spec.timestamp is None
        for meta, payload, key in items:
            ts = meta[0]
            event = ts if by_source_time else self.event_ms(meta, payload, out)
            if event is None:
                continue
            # The oldest window over ``event`` starts at the first multiple of the slide past
            # ``event - size`` (assign's first; its list is built only where it is needed).
            if ts < ((event - size) // slide + 1) * slide + size + lateness:  # on time for the oldest window: for all of them
                start = event - event % pane
                pane_key = (key, start, start + pane, PANE)
                feed.append((meta, payload, pane_key))
                if meta[5] or pane_key in timed:
                    continue
                timed.add(pane_key)
                on_time = assign(event)
            else:
                on_time = [w for w in assign(event) if ts < w[1] + lateness]
                for start, end in on_time:
                    window_key = (key, start, end)
                    feed.append((meta, payload, window_key))
                    self._own.add(window_key)
                out.append(self._late(meta, key, payload, event))
            if not meta[5]:
                for start, end in on_time:
                    set_timer((end + lateness, -1, -1, -1), (key, start, end), acks)
        if feed:
            self.keyed.apply_batch(feed)
        return out

    def advance(self, watermark: tuple) -> None:
        """Fold what settled below ``watermark``; forget the panes and windows whose last
        window was emitted below it."""
        self.keyed.advance(watermark)
        gone = [state_key for _, state_key in self._take_emitted(watermark)]
        if gone:
            self.keyed.backend.remove_many(gone)
            self._own.difference_update(gone)
            self._timed.difference_update(gone)

    def fire(self, watermark: tuple, acks: AckTable) -> list:
        """As :meth:`~.windowed_state.WindowedState.fire`: each window closing, its panes combined."""
        out, backend = [], self.keyed.backend
        get = backend.get
        # A window reads size / pane panes: from the backend's dict in memory (a ``get`` call
        # each was a third of firing), through ``get`` where it misses.
        cached, removed = backend.read_view()
        combine, result, pane, slide = self.spec.combine, self.spec.result, self.pane, self.slide
        own, emitted = self._own, self._emitted
        for close, window_keys in self._due(watermark, acks):
            for window_key in window_keys:
                key, start, end = window_key
                state = None
                for p in range(start, end, pane):
                    pane_key = (key, p, p + pane, PANE)
                    part = cached.get(pane_key, _MISSING)
                    if part is _MISSING:
                        part = get(pane_key)
                    elif part is removed:
                        part = None
                    if part is None:
                        if p < start + slide:
                            self._timed.discard(pane_key)  # its elements were all retracted
                        continue
                    state = part if state is None else combine(state, part)
                    if p < start + slide:  # no later window holds this pane
                        emitted.append((close, pane_key))
                if window_key in own:
                    part = get(window_key)
                    if part is not None:
                        state = part if state is None else combine(state, part)
                    emitted.append((close, window_key))
                if state is not None:
                    out.append(((*close, (self._hash(key), start), False), WindowResult(key, start / 1000, end / 1000, result(state))))
        out.sort(key=lambda item: item[0])
        return out

    def restore_timers(self, acks: AckTable, watermark: Optional[tuple] = None) -> None:
        """Set the timers of the windows over the restored panes and windows that close at or
        after ``watermark``, the snapshot's (None: every one). O(restored states x windows per pane)."""
        watermark = BOTTOM if watermark is None else watermark
        size, slide, pane, remove = self.size, self.slide, self.pane, self.keyed.backend.remove
        for state_key, _ in list(self.keyed.backend.items()):
            if len(state_key) == 3:  # a window's own state
                if self._restore_window(state_key, self._close(state_key[2]), watermark, acks):
                    self._own.add(state_key)
                continue
            key, p = state_key[0], state_key[1]
            first = -((size - pane - p) // slide) * slide  # the first start s (a multiple of slide) with s + size >= p + pane
            windows = [(start, start + size) for start in range(first, p + 1, slide) if self._close(start + size) >= watermark]
            if not windows:
                remove(state_key)  # every window over it was emitted before the snapshot
            else:
                self._timed.add(state_key)  # an element on time for all its windows closes none below T
            for start, end in windows:
                self._set_timer(self._close(end), (key, start, end), acks)
