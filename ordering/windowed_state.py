"""A windowed aggregation of one operator instance: drifting state per (key, window), and
a timer per close time that holds the watermark until the windows closing then are emitted.

Each element goes, per window it belongs to (:mod:`.windows`), into a
:class:`~driftstream.ordering.keyed_state.DriftingKeyedState` under the key
``(key, start_ms, end_ms)``: elements may arrive in any order, and what settles below
the watermark is folded in t order, as for ``stateful_map``. An element whose source
time has reached a window's close is *late* for it: it is not added, and it leaves as
a :class:`~driftstream.ordering.windows.Late` record at its own t.

The first element of a window registers a *timer* at the window's close time: an XOR
entry in the acker's table, as for an element in flight (one entry per instance and
close time, whatever the number of keys). The acker's watermark therefore stops at the
close time, with every element below it settled; :meth:`WindowedState.fire` then emits
each window closing there as a :class:`~driftstream.ordering.windows.WindowResult` at
the close time, and XORs the timer out in the same flush as the results' batch ids. A
window's content is the set of elements below its close: the same for any arrival
order, parallelism, or failure.

>>> from driftstream.ordering.windows import Tumbling, WindowSpec
>>> count = WindowSpec(Tumbling(1), step=lambda n, x: ((n or 0) + 1, None), result=lambda n: n)
>>> ws, acks = WindowedState(count, seed=1), AckTable()
>>> ws.apply_batch([((10, 0, 0, 1, (), False), "a", "k"), ((900, 0, 0, 2, (), False), "b", "k")], acks)
[]
>>> list(acks) == [(1000, -1, -1, -1)]                   # a timer at the close of [0 s, 1 s)
True
>>> ws.advance((1000, -1, -1, -1)); out = ws.fire((1000, -1, -1, -1), acks)
>>> [p for _, p in out], acks[(1000, -1, -1, -1)]          # the timer's XOR is back to 0
([WindowResult(key='k', start=0.0, end=1.0, value=2)], 0)
>>> [p for _, p in ws.apply_batch([((1500, 0, 0, 3, (), False), "c", "k")], acks)]  # event time 1.5 s: on time
[]

Costs: an element costs one assignment and, per window, what ``stateful_map`` costs it;
a timer is O(log timers) to set and to fire; firing reads and removes each closing
window's state once.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from typing import Any, Callable, Hashable, Iterator, Optional

from .ack_table import AckTable
from .keyed_state import DriftingKeyedState, StateFnError
from .meta import invalidee_of
from .partitioning import stable_hash
from .windows import Late, Session, WindowResult, WindowSpec, close_time


class _TimedState:
    """What both window forms share: the keyed state, the timers, the late count."""

    def __init__(self, spec: WindowSpec, step: Callable, backend: Any, seed: Optional[int], flat: bool = False,
                 on_error: Optional[Callable] = None) -> None:
        self.spec = spec
        #: how long past a window's end (ms) its elements are on time: its close is ``end + lateness_ms``
        self.lateness_ms = close_time(0, spec.allowed_lateness)[0]
        #: ``on_error(meta, payload, exc)``: what an element whose timestamp function raised
        #: is emitted as (a dead letter) instead of failing; it joins no window
        self.on_error = on_error
        self.keyed = DriftingKeyedState(step, flat=flat, backend=backend)
        self.rng = random.Random(seed)
        self.timers: dict = {}  # close time -> (timer id, {what closes then, ...})
        self._heap: list = []
        # What was emitted at a close time the watermark has not passed yet: (close, state key).
        # Its state stays until the watermark does: a snapshot at a watermark equal to the close
        # time is taken after the emission, at that very time, and a replay from it must emit again.
        self._emitted: list = []
        self.late = 0  # late elements (less their tombstones)

    @staticmethod
    def _hash(key: Hashable) -> int:
        """:func:`key_hash`, remembered for the last 65,536 keys: a key's windows close one
        after another (two crc32 a result otherwise, a tenth of a sliding count's firing)."""
        return _recent_key_hash(key)

    @property
    def tombstones_emitted(self) -> int:
        return self.keyed.tombstones_emitted

    @property
    def out_of_order(self) -> int:
        return self.keyed.out_of_order

    def log_size(self) -> int:
        return self.keyed.log_size()

    def event_ms(self, meta: tuple, payload: Any, out: Optional[list] = None) -> Optional[int]:
        """An element's event time in ms: ``timestamp(payload)`` seconds, or its source time.

        If the timestamp function raises: with ``on_error``, the element's dead letter is
        appended to ``out`` and None returned (a tombstone's too: its payload is its
        element's, so it raises alike and retracts the letter); else StateFnError.
        """
        timestamp = self.spec.timestamp
        if timestamp is None:
            return meta[0]
        try:
            return math.floor(timestamp(payload) * 1000)
        except Exception as exc:
            if self.on_error is None or out is None:
                raise StateFnError(meta, payload) from exc
            out.append((meta, self.on_error(meta, payload, exc)))
            return None

    def _set_timer(self, close: tuple, member: Hashable, acks: AckTable) -> None:
        timer = self.timers.get(close)
        if timer is None:
            timer = self.timers[close] = (self.rng.getrandbits(64) or 1, set())
            acks.xor(close, timer[0])
            heapq.heappush(self._heap, close)
        timer[1].add(member)

    def _due(self, watermark: tuple, acks: AckTable) -> Iterator[tuple]:
        """``(close time, members)`` of the timers the watermark has reached, oldest first; their
        XORs go into ``acks``."""
        heap = self._heap
        while heap and heap[0] <= watermark:
            close = heapq.heappop(heap)
            timer_id, members = self.timers.pop(close)
            acks.xor(close, timer_id)
            yield close, members

    def _restore_window(self, window_key: tuple, close: tuple, watermark: Optional[tuple], acks: AckTable) -> bool:
        """A window restored from a snapshot taken at ``watermark``: its timer again, or, if it
        closed below the watermark (emitted and released before the snapshot: the watermark
        can pass several closes at once, and an emitted window's state stays until the next
        one), its state dropped. Returns whether it was kept."""
        if watermark is not None and close < watermark:
            self.keyed.backend.remove(window_key)
            return False
        self._set_timer(close, window_key, acks)
        return True

    def _late(self, meta: tuple, key: Hashable, payload: Any, event: int) -> tuple:
        self.late += -1 if meta[5] else 1
        return (meta, Late(key, payload, event / 1000))

    def _take_emitted(self, watermark: tuple) -> list:
        """``(close, state key)`` of what was emitted below ``watermark``, for the caller to
        forget; they leave :attr:`_emitted`. O(emitted)."""
        emitted = self._emitted
        if not emitted or emitted[0][0] >= watermark:
            return []
        gone, keep = [], []
        for item in emitted:
            (gone if item[0] < watermark else keep).append(item)
        self._emitted = keep
        return gone


class WindowedState(_TimedState):
    """The windows of every key of one instance; see the module doc.

    ``backend``: where settled window states live (snapshots and restore, as for
    ``stateful_map``). Restored windows get their timers back from :meth:`restore_timers`.
    """

    def __init__(self, spec: WindowSpec, backend: Any = None, seed: Optional[int] = None, on_error: Optional[Callable] = None) -> None:
        super().__init__(spec, spec.step, backend, seed, on_error=on_error)

    def apply_batch(self, items: list, acks: AckTable) -> list:
        """Take ``(meta, payload, key)`` elements and tombstones; timers go into ``acks``.
        Returns the :class:`Late` records (and their tombstones) to emit."""
        assign, pairs = self.spec.assigner.assign, self.spec.pairs
        lateness_ms = self.lateness_ms
        feed, out, timed = [], [], None
        by_source_time = self.spec.timestamp is None
        for meta, payload, key in items:
            event = meta[0] if by_source_time else self.event_ms(meta, payload, out)
            if event is None:
                continue
            late = False
            for start, end in assign(event):
                close_ms = end + lateness_ms
                if meta[0] >= close_ms:
                    late = True
                    continue
                window_key = (key, start, end)
                feed.append((meta, payload if pairs is None else (meta[4][-1], payload), window_key))
                # A batch's elements of one window often come together (a key's, or results
                # keyed by their window): its timer is set once for the run of them.
                if not meta[5] and window_key != timed:
                    self._set_timer((close_ms, -1, -1, -1), window_key, acks)
                    timed = window_key
            if late:
                out.append(self._late(meta, key, payload, event))
        if feed:
            self.keyed.apply_batch(feed)  # a window step emits nothing per element
        return out

    def advance(self, watermark: tuple) -> None:
        """Fold what settled below ``watermark`` into the windows' states; forget the windows
        emitted below it."""
        self.keyed.advance(watermark)
        gone = self._take_emitted(watermark)
        if gone:
            self.keyed.backend.remove_many([window_key for _, window_key in gone])

    def fire(self, watermark: tuple, acks: AckTable) -> list:
        """Emit the windows whose close time the watermark has reached (after :meth:`advance`),
        each at its close time; their timers' XORs go into ``acks``. Returns ``(meta, WindowResult)``.

        A result's meta is ``close time + (h, start_ms)`` with ``h`` a 64-bit hash of the key:
        results of one close time are ordered the same way in every instance and run."""
        out, backend, result, pairs = [], self.keyed.backend, self.spec.result, self.spec.pairs
        for close, window_keys in self._due(watermark, acks):
            for window_key in window_keys:
                key, start, end = window_key
                state = backend.get(window_key)
                if state is None:
                    continue  # every element of the window was retracted
                self._emitted.append((close, window_key))
                if pairs is None:
                    meta = (*close, (self._hash(key), start), False)
                    out.append((meta, WindowResult(key, start / 1000, end / 1000, result(state))))
                    continue
                h = self._hash(key)
                for i, payload in enumerate(pairs(key, state)):
                    out.append(((*close, (h, start, i), False), payload))
        out.sort(key=lambda item: item[0])
        return out

    def restore_timers(self, acks: AckTable, watermark: Optional[tuple] = None) -> None:
        """Set the timers of the windows restored from a snapshot taken at ``watermark`` (None:
        all of them); drop those that closed below it (:meth:`_restore_window`). O(restored windows)."""
        lateness = self.spec.allowed_lateness
        for window_key, _ in list(self.keyed.backend.items()):
            self._restore_window(window_key, close_time(window_key[2], lateness), watermark, acks)


def session_merge(spec: WindowSpec) -> Callable[[Any, tuple], tuple]:
    """A key's step function under :class:`SessionState` (also what a restore re-applies
    deltas with): ``sessions, (meta, event_ms, x) -> (sessions, None)``; see its class doc."""
    gap, lateness_ms = spec.assigner.gap_ms, close_time(0, spec.allowed_lateness)[0]

    def merge(sessions: Any, item: tuple) -> tuple:
        meta, event, x = item
        ts = meta[0]
        lo, hi, elements, keep = event, event, [(meta, x)], []
        for session in sessions or ():
            start, last, held = session
            if last + gap + lateness_ms <= ts:
                continue  # closed: its timer emitted it
            if event < last + gap and event + gap > start:
                lo, hi = min(lo, start), max(hi, last)
                elements.extend(held)
            else:
                keep.append(session)
        elements.sort(key=_first)
        keep.append((lo, hi, tuple(elements)))
        keep.sort(key=_first)
        return tuple(keep), None

    return merge


def _first(item: tuple) -> Any:
    return item[0]


def step_function(spec: WindowSpec) -> Callable[[Any, Any], tuple]:
    """The function a window step's backend re-applies inputs with on restore."""
    return session_merge(spec) if isinstance(spec.assigner, Session) else spec.step


def key_hash(key: Hashable) -> int:
    """A 64-bit hash of a key, the same in every process and for equal keys (``1``, ``1.0``):
    two :func:`~driftstream.ordering.partitioning.stable_hash` of it, one salted.

    >>> key_hash("a") == key_hash("a") != key_hash("b"), key_hash(1) == key_hash(1.0)
    (True, True)
    """
    return (stable_hash(key) << 32) | stable_hash((key, "salt"))


_recent_key_hash = functools.lru_cache(maxsize=1 << 16)(key_hash)


class SessionState(_TimedState):
    """Session windows of every key of one instance: the same timers and closing rules as
    :class:`WindowedState`, but a key's windows are its sessions, which grow and merge.

    A key's settled state is its open sessions, ``((start_ms, last_ms, ((meta, x), ...)), ...)``
    sorted by start, each holding its elements in t order (a session's aggregate is folded
    when it closes: merging two sessions' partial folds would need a merge function).
    Applying an element (in t order, through :class:`DriftingKeyedState`) first drops the
    sessions its source time has closed (their timers emitted them), then merges it with
    every session its ``[event, event + gap)`` overlaps. An element is late when its own
    session ``[event, event + gap)`` would have closed by its source time; a session's close
    is that of its latest element, whose timer is set when that element arrives.

    >>> from driftstream.ordering.windows import Session, WindowSpec
    >>> count = WindowSpec(Session(0.01), step=lambda n, x: ((n or 0) + 1, None), result=lambda n: n, timestamp=lambda x: x)
    >>> ss, acks = SessionState(count, seed=1), AckTable()
    >>> e = lambda ts, x: ((ts, 0, 0, ts, (), False), x, "k")
    >>> ss.apply_batch([e(1, 0.000), e(2, 0.008), e(3, 0.030)], acks)   # event times 0, 8 and 30 ms
    []
    >>> ss.advance((18, -1, -1, -1)); [p for _, p in ss.fire((18, -1, -1, -1), acks)]
    [WindowResult(key='k', start=0.0, end=0.018, value=2)]
    """

    def __init__(self, spec: WindowSpec, backend: Any = None, seed: Optional[int] = None, on_error: Optional[Callable] = None) -> None:
        super().__init__(spec, session_merge(spec), backend, seed, on_error=on_error)
        self.gap = spec.assigner.gap_ms

    def _close(self, last_ms: int) -> int:
        return last_ms + self.gap + self.lateness_ms

    def apply_batch(self, items: list, acks: AckTable) -> list:
        """As :meth:`WindowedState.apply_batch`."""
        feed, out = [], []
        for meta, payload, key in items:
            event = self.event_ms(meta, payload, out)
            if event is None:
                continue
            close = (self._close(event), -1, -1, -1)
            plain = invalidee_of(meta)  # a tombstone's payload matches its element's
            if meta[0] >= close[0]:
                out.append(self._late(meta, key, payload, event))
                continue
            feed.append((meta, (plain, event, payload), key))
            if not meta[5]:
                self._set_timer(close, key, acks)
        if feed:
            self.keyed.apply_batch(feed)
        return out

    def advance(self, watermark: tuple) -> None:
        """Fold what settled below ``watermark``; drop the sessions emitted below it."""
        self.keyed.advance(watermark)
        backend = self.keyed.backend

        for close, key in self._take_emitted(watermark):
            sessions = tuple(s for s in backend.get(key) or () if self._close(s[1]) > close[0])
            if sessions:
                backend.put(key, sessions)
            else:
                backend.remove(key)

    def fire(self, watermark: tuple, acks: AckTable) -> list:
        """As :meth:`WindowedState.fire`: the sessions whose close time the watermark reached."""
        out, backend = [], self.keyed.backend
        step, result = self.spec.step, self.spec.result
        for close, keys in self._due(watermark, acks):
            for key in keys:
                for start, last, elements in backend.get(key) or ():
                    if self._close(last) != close[0]:
                        continue
                    acc = None
                    for _, x in elements:
                        acc = step(acc, x)[0]
                    meta = (*close, (self._hash(key), start), False)
                    out.append((meta, WindowResult(key, start / 1000, (last + self.gap) / 1000, result(acc))))
                    self._emitted.append((close, key))
        out.sort(key=lambda item: item[0])
        return out

    def restore_timers(self, acks: AckTable, watermark: Optional[tuple] = None) -> None:
        """As :meth:`WindowedState.restore_timers`: a timer per restored session."""
        for key, sessions in list(self.keyed.backend.items()):
            for _, last, _ in sessions:
                self._set_timer((self._close(last), -1, -1, -1), key, acks)


class IntervalJoinState(_TimedState):
    """A keyed interval join of one instance (Flink's): a left ``l`` and a right ``r`` of one
    key pair up when ``l.time + lower <= r.time <= l.time + upper`` (source times, ms), and the
    pair leaves as soon as the later of the two is applied, at its t.

    A key's state is ``(lefts, rights)``, each element as ``(time_ms, meta, x, matched)``.
    Applying an element (in t order) first drops the elements no later one can match: a left
    once the source time passes ``l.time + upper``, a right once it passes ``r.time - lower``.
    With ``how="left"`` (``"outer"``), a left (and a right) that matched nothing leaves as
    ``(key, l, None)`` (``(key, None, r)``) at that moment: a timer there holds the watermark.

    >>> ij, acks = IntervalJoinState(lower_ms=0, upper_ms=5, how="left", seed=1), AckTable()
    >>> e = lambda ts, side, x: ((ts, 0, 0, ts, (side,), False), x, "k")
    >>> [p for _, p in ij.apply_batch([e(1, 0, "l1"), e(3, 1, "r1"), e(4, 0, "l2")], acks)]
    [('k', 'l1', 'r1')]
    >>> ij.advance((10, -1, -1, -1)); [p for _, p in ij.fire((10, -1, -1, -1), acks)]
    [('k', 'l2', None)]
    """

    def __init__(self, lower_ms: int, upper_ms: int, how: str = "inner", backend: Any = None, seed: Optional[int] = None) -> None:
        super().__init__(WindowSpec(None, None, None), interval_step(lower_ms, upper_ms), backend, seed, flat=True)
        self.lower, self.upper, self.how = lower_ms, upper_ms, how

    def _expiry(self, side: int, time_ms: int) -> tuple:
        """The global time at which an element stops matching: source time past its range (and
        past its own: with ``upper < 0`` a left can only match rights before it)."""
        return (_last_match(side, time_ms, self.lower, self.upper) + 1, -1, -1, -1)

    def _pads(self, side: int) -> bool:
        return self.how == "outer" or (self.how == "left" and side == 0)

    def apply_batch(self, items: list, acks: AckTable) -> list:
        """Take ``(meta, payload, key)`` of both sides (the side: the last child id); returns the pairs."""
        feed = []
        for meta, payload, key in items:
            side = meta[4][-1]
            plain = invalidee_of(meta)  # a tombstone's payload matches its element's
            feed.append((meta, (side, plain, key, payload), key))
            if not meta[5] and self._pads(side):
                self._set_timer(self._expiry(side, meta[0]), key, acks)
        return self.keyed.apply_batch(feed) if feed else []

    def advance(self, watermark: tuple) -> None:
        """Fold what settled below ``watermark``; drop the unmatched elements emitted below it."""
        self.keyed.advance(watermark)
        backend = self.keyed.backend

        for close, key in self._take_emitted(watermark):
            state = backend.get(key)
            if state is None:
                continue
            lefts, rights = (tuple(e for e in held if self._expiry(side, e[0]) > close) for side, held in enumerate(state))
            if lefts or rights:
                backend.put(key, (lefts, rights))
            else:
                backend.remove(key)

    def fire(self, watermark: tuple, acks: AckTable) -> list:
        """The unmatched elements (left / outer joins) whose expiry the watermark reached."""
        out, backend = [], self.keyed.backend
        for close, keys in self._due(watermark, acks):
            for key in keys:
                state = backend.get(key)
                if state is None:
                    continue
                h, emitted = self._hash(key), False
                for side, held in enumerate(state):
                    if not self._pads(side):
                        continue
                    for time_ms, meta, x, matched in held:
                        if not matched and self._expiry(side, time_ms) == close:
                            pair = (key, x, None) if side == 0 else (key, None, x)
                            out.append(((*close, (h, side, *meta[:4], *meta[4]), False), pair))
                            emitted = True
                if emitted:
                    self._emitted.append((close, key))
        out.sort(key=lambda item: item[0])
        return out

    def restore_timers(self, acks: AckTable, watermark: Optional[tuple] = None) -> None:
        """A timer per restored element that may still have to leave unmatched."""
        for key, state in list(self.keyed.backend.items()):
            for side, held in enumerate(state):
                if self._pads(side):
                    for time_ms, _, _, matched in held:
                        if not matched:
                            self._set_timer(self._expiry(side, time_ms), key, acks)


def _last_match(side: int, time_ms: int, lower_ms: int, upper_ms: int) -> int:
    """The last source time at which an element of ``side`` may still meet a match (or leave unmatched)."""
    return max(time_ms, time_ms + upper_ms if side == 0 else time_ms - lower_ms)


def interval_step(lower_ms: int, upper_ms: int) -> Callable[[Any, tuple], tuple]:
    """An interval join's step function (also what a restore re-applies deltas with):
    ``state, (side, meta, key, x) -> (state, [(key, left, right), ...])``; see :class:`IntervalJoinState`."""

    def step(state: Any, item: tuple) -> tuple:
        side, meta, key, x = item
        now = meta[0]
        lefts, rights = state or ((), ())
        lefts = tuple(e for e in lefts if _last_match(0, e[0], lower_ms, upper_ms) >= now)
        rights = tuple(e for e in rights if _last_match(1, e[0], lower_ms, upper_ms) >= now)
        pairs, matched = [], False
        if side == 0:
            kept = []
            for r in rights:
                if now + lower_ms <= r[0] <= now + upper_ms:
                    pairs.append((meta, x, r[2]))
                    r = (r[0], r[1], r[2], True)
                kept.append(r)
            rights, matched = tuple(kept), bool(pairs)
            lefts += ((now, meta, x, matched),)
        else:
            kept = []
            for left in lefts:
                if left[0] + lower_ms <= now <= left[0] + upper_ms:
                    pairs.append((meta, left[2], x))
                    left = (left[0], left[1], left[2], True)
                kept.append(left)
            lefts, matched = tuple(kept), bool(pairs)
            rights += ((now, meta, x, matched),)
        return (lefts, rights), [(key, left, right) for _, left, right in pairs]

    return step
