"""Order-sensitive keyed state that repairs itself when an element arrives late.

Per key there is a *settled* state (the fold of everything below the watermark, kept
in a state backend; "base" is reserved for a snapshot's full checkpoint) and an in-memory *log* of the elements at or above the
watermark, each with the state after it and the outputs it produced. Elements
may arrive in any order; the log is kept sorted by Meta, and whenever an element
lands anywhere but the tail, the tail is re-applied and only the outputs that
changed are invalidated (a tombstone) and re-emitted.

>>> def concat(state, x):
...     new = (state or "") + x
...     return new, new
>>> ks = DriftingKeyedState(concat)
>>> ks.apply(Meta(2, 0, 0, 2), "b", "k")
[(Meta(ts=2, source=0, partition=0, offset=2, child_ids=(), tombstone=False), 'b')]
>>> [(m[0], m[5], p) for m, p in ks.apply(Meta(1, 0, 0, 1), "a", "k")]   # (ts, tombstone, payload)
[(1, False, 'a'), (2, True, 'b'), (2, False, 'ab')]
>>> ks.advance((3,)); ks.log_size(), ks.backend.get("k")
(0, 'ab')

The user function must not mutate the state it is given (it may be applied
again to the same state after a late arrival): return a new value instead.

Costs: an in-order element is O(1) (an append, and a queue push for a new head) plus one call
of the function; an element that lands i places before the tail costs i + 1
calls; ``advance`` is O(1) per log entry it folds, O(log n) per key whose head came out of order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol, runtime_checkable

from .accelerators import accelerator
from .meta import Meta, child_of, invalidee_of, tombstone_of
from .sorted_queue import SortedQueue

#: the in-order path in C (ordering/_drifting.c), or None: the Python below is the whole implementation
_drifting = accelerator("driftstream.ordering._drifting")

if _drifting is not None:
    _LogFields = _drifting.LogFields
else:
    class _LogFields:  # type: ignore[no-redef]
        __slots__ = ("metas", "payloads", "after", "outputs")

#: ``fn(state, element) -> (new_state, output)``; for flat: ``(new_state, iterable_of_outputs)``.
StateFn = Callable[[Any, Any], tuple]


class StateFnError(Exception):
    """The user function raised on ``(meta, payload)``; the original is ``__cause__``."""

    def __init__(self, meta: Meta, payload: Any) -> None:
        super().__init__(meta, payload)
        self.meta, self.payload = meta, payload


#: what no state is: :meth:`DictBackend.read_view`'s mark of a removed key
_NEVER = object()


@runtime_checkable
class StateBackend(Protocol):
    """Where a keyed state's settled states live, one per key: :class:`DictBackend` (tests,
    the simulator) and ``snapshots.state_cache.StateCache`` (RocksDB behind a cache). What
    each method means is :class:`DictBackend`'s doc."""

    def get(self, key: Hashable) -> Any: ...

    def put(self, key: Hashable, state: Any) -> None: ...

    def fold(self, key: Hashable, state: Any, inputs: list) -> None: ...

    def remove(self, key: Hashable) -> None: ...

    def remove_many(self, keys: Iterable[Hashable]) -> None: ...

    def read_view(self) -> tuple: ...

    def items(self) -> Iterable[tuple]: ...


class DictBackend:
    """Base states in a dict: the backend for unit tests and the simulator.

    The backend protocol: ``get(key)`` (None when missing), ``put(key, state)``, ``remove(key)``,
    ``remove_many(keys)``, ``read_view()`` (``(states, removed)``: a dict of the states held
    in memory, for reading, and the mark of a removed one; a key missing from it needs a
    ``get``), ``fold(key, state, inputs)`` (``state`` is what folding ``inputs``, in order, into
    the previous state gave: a snapshotting backend may record the inputs instead of
    the state), ``items()``.

    >>> b = DictBackend(); b.put("k", 1); b.fold("k", 3, [2]); b.get("k"), b.get("missing")
    (3, None)
    """

    def __init__(self) -> None:
        self._data: dict = {}

    def get(self, key: Hashable) -> Any:
        return self._data.get(key)

    def put(self, key: Hashable, state: Any) -> None:
        self._data[key] = state

    def fold(self, key: Hashable, state: Any, inputs: list) -> None:
        self._data[key] = state

    def remove(self, key: Hashable) -> None:
        """The key has no state any more (a closed window)."""
        self._data.pop(key, None)

    def remove_many(self, keys: Iterable[Hashable]) -> None:
        """:meth:`remove` of each key (the windows a watermark passed)."""
        pop = self._data.pop
        for key in keys:
            pop(key, None)

    def read_view(self) -> tuple:
        """``(states, removed)``: every state, by key; nothing is marked removed here."""
        return self._data, _NEVER

    def items(self) -> Iterable[tuple]:
        return self._data.items()


class KeyLog(_LogFields):
    """The elements of one key at or above the watermark, sorted by Meta, each with what
    applying it left (``after``: the state after it, or the journal of its writes; None
    while it is not applied) and the outputs it produced. Its four lists are fields of a
    C type where the in-order path is built, which builds logs itself."""

    __slots__ = ()

    def __init__(self) -> None:
        self.metas: list = []
        self.payloads: list = []
        self.after: list = []
        self.outputs: list = []  # per entry: the list of payloads it emitted

    @classmethod
    def of(cls, meta: tuple, payload: Any) -> "KeyLog":
        """A log of one element (a key's first in the log: most of a backlog's keys). O(1)."""
        log = cls.__new__(cls)
        log.metas, log.payloads, log.after, log.outputs = [meta], [payload], [None], [NO_OUTPUT]
        return log

    def insert(self, meta: tuple, payload: Any) -> int:
        """Insert after any equal Meta; returns the index. O(1) at the tail, else O(n)."""
        metas = self.metas
        if not metas or metas[-1] <= meta:
            i = len(metas)
            metas.append(meta)
            self.payloads.append(payload)
            self.after.append(None)
            self.outputs.append(NO_OUTPUT)
            return i
        i = bisect_right(metas, meta)
        metas.insert(i, meta)
        self.payloads.insert(i, payload)
        self.after.insert(i, None)
        self.outputs.insert(i, NO_OUTPUT)
        return i

    def remove(self, i: int) -> list:
        """Drop entry ``i``; returns its outputs."""
        del self.metas[i], self.payloads[i], self.after[i]
        return self.outputs.pop(i)

    def find(self, meta: tuple, payload: Any) -> int:
        """Index of the entry with this Meta and payload, or -1."""
        metas = self.metas
        i = bisect_left(metas, meta)
        while i < len(metas) and metas[i] == meta:
            if self.payloads[i] == payload:
                return i
            i += 1
        return -1


NO_OUTPUT: list = []  # shared, never mutated: outputs are replaced, not changed


class DriftingLogs:
    """What every form of drifting keyed state shares: per key a :class:`KeyLog` of the
    elements at or above the watermark; tombstones (also before their invalidee);
    re-application from the earliest change of each key in a batch; the outputs that
    changed, invalidated and emitted anew; and folding below the watermark.

    A form implements ``_replay(key, log, i, out)`` (apply entries i.. of the log,
    every one of them not applied) and ``_fold(key, log, n)`` (the first n entries
    leave the log for the backend), and may implement ``_roll_back(key, log, i)``
    (entries i.. are about to be applied again: undo what they left) and ``_folded()``
    (an advance has folded every key it passed).

    ``on_error(meta, payload, exc)``, when given, is what an element whose function raised
    outputs instead of failing (a dead letter); the key's state is as if it had not come.

    ``_path``, where the C accelerator is built, runs ``apply_batch`` and ``advance`` of the two
    forms below for the common case (an element at the tail of its key's log) and calls back
    ``_land``, ``_replay_failed``, ``_emit_diff`` and ``_check_pending`` for the rest. A subclass
    gets the Python: it may change any step the accelerator runs.
    """

    _path: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._path = None

    def __init__(self, fn: Callable, flat: bool, backend: Any, on_error: Optional[Callable] = None) -> None:
        self.fn = fn
        self.flat = flat
        self.backend = backend
        self.on_error = on_error
        #: metas of the log entries whose function raised (their outputs are dead letters):
        #: not inputs of the state, so not folded as such
        self.diverted: set = set()
        self.logs: dict = {}
        # Tombstones whose invalidee has not arrived yet (any arrival order is legal).
        self.pending_tombstones: dict = {}
        # The key of each log that became non-empty or got a new head, at that head;
        # stale rows are skipped when popped. One push per key, not per element.
        self._heads = SortedQueue()
        self._size = 0
        self.tombstones_emitted = 0
        #: elements that landed before the tail of their key's log: arrived after an element
        #: later in t, so the key's state was rolled back and re-applied from them
        self.out_of_order = 0

    def log_size(self) -> int:
        """Number of entries held in memory over all keys (O(1))."""
        return self._size

    def apply(self, meta: Meta, payload: Any, key: Hashable) -> list:
        """Take one element or tombstone of ``key``; return what to emit downstream."""
        return self.apply_batch([(meta, payload, key)])

    def apply_batch(self, items: list) -> list:
        """Take ``(meta, payload, key)`` elements and tombstones; return what to emit.

        An element that lands at the tail of a key the batch has not touched yet (its log is
        all applied) is applied at once: a batch in t order gives its outputs in t order, in
        one pass. Anything else (a tombstone, an element before its key's tail) marks its
        key touched, and what lands on a touched key waits: each touched key is re-applied
        once, from its earliest change, when the whole batch has landed (a tombstone and its
        replacement arriving together cost one re-application, not two).
        """
        if self._path is not None:
            return self._path.apply_batch(self, items)
        out: list = []
        touched: dict = {}  # key -> earliest log index changed
        for meta, payload, key in items:
            i = self._land(meta, payload, key, out)
            if i < 0:
                continue
            if key in touched:
                if i < touched[key]:
                    touched[key] = i
                continue
            log = self.logs[key]
            if not meta[5] and i == len(log.metas) - 1:
                self._replay(key, log, i, out)
            else:
                touched[key] = i
        for key, i in touched.items():
            log = self.logs.get(key)
            if log is None:
                continue
            if log.metas:
                self._replay(key, log, i, out)
            else:
                del self.logs[key]
        return out

    def apply_items(self, items: list) -> list:
        """:meth:`apply_batch`, each output as a step's item ``(meta, payload, None)`` (what a
        keyed step hands on: the C builds them so, with no pair per output to convert)."""
        if self._path is not None:
            return self._path.apply_batch(self, items, True)
        return [(m, p, None) for m, p in self.apply_batch(items)]

    def _roll_back(self, key: Hashable, log: KeyLog, i: int) -> None:
        """Entries i.. of the log are about to be re-applied (nothing to undo for values)."""

    def _folded(self) -> None:
        """An advance has folded every key the watermark passed (values: each went at once)."""

    def _land(self, meta: tuple, payload: Any, key: Hashable, out: list) -> int:
        """Put one element into (or a tombstone's invalidee out of) the key's log.

        Returns the log index from which the key must be re-applied, or -1.
        """
        log = self.logs.get(key)
        if meta[5]:
            invalidee = invalidee_of(meta)
            i = log.find(invalidee, payload) if log is not None else -1
            if i < 0:
                self.pending_tombstones.setdefault(key, []).append((invalidee, payload))
                return -1
            self._roll_back(key, log, i)
            self._size -= 1
            if self.diverted:
                self.diverted.discard(invalidee)
            self._emit_diff(invalidee, log.remove(i), NO_OUTPUT, out)
            return i
        if self.pending_tombstones:
            pending = self.pending_tombstones.get(key)
            if pending and (meta, payload) in pending:
                pending.remove((meta, payload))
                if not pending:
                    del self.pending_tombstones[key]
                return -1
        if log is None:
            self.logs[key] = KeyLog.of(meta, payload)
            self._size += 1
            self._heads.push(meta, key)
            return 0
        i = log.insert(meta, payload)
        if i < len(log.metas) - 1:
            self.out_of_order += 1
            self._roll_back(key, log, i + 1)
        self._size += 1
        if i == 0:
            self._heads.push(meta, key)
        return i

    def advance(self, watermark: tuple) -> None:
        """Fold every entry below ``watermark`` into the backend and forget it."""
        if self._path is not None:
            self._path.advance(self, watermark)
            return
        heads, logs = self._heads, self.logs
        for key in heads.pop_below(watermark):
            log = logs.get(key)
            if log is None:
                continue  # stale row: the log was folded since
            metas = log.metas
            if not metas[0] < watermark:
                # Stale row: its head was retracted by a tombstone. Track the new head,
                # or the key would never be folded again.
                heads.push(metas[0], key)
                continue
            n = len(metas) if metas[-1] < watermark else bisect_left(metas, watermark)
            self._fold(key, log, n)
            self._size -= n
            if n == len(metas):  # all of it (the common case): the log goes whole
                del logs[key]
                continue
            del metas[:n], log.payloads[:n], log.after[:n], log.outputs[:n]
            heads.push(metas[0], key)
        self._folded()
        if self.pending_tombstones:
            self._check_pending(watermark)

    def _check_pending(self, watermark: tuple) -> None:
        """An unmatched tombstone below the watermark would mean its invalidee was lost."""
        for key, pending in self.pending_tombstones.items():
            for invalidee, _ in pending:  # any of them, not only the first to arrive
                if invalidee < watermark:
                    raise AssertionError(f"tombstone for {invalidee} below the watermark never met its element")

    def _record(self, log: KeyLog, j: int, result: Any, out: list) -> None:
        """Entry j produced ``result``: emit what changed against its previous outputs."""
        flat = self.flat
        if flat:
            new = list(result) if result is not None else NO_OUTPUT
        else:
            new = NO_OUTPUT if result is None else [result]
        old = log.outputs[j]
        if new != old:
            if old:
                self._emit_diff(log.metas[j], old, new, out)
            elif flat:  # first application: nothing to invalidate
                m0, m1, m2, m3, ids, m5 = log.metas[j]
                if len(new) == 1:  # the common case (the index: one change record), without a comprehension's frame
                    out.append(((m0, m1, m2, m3, ids + (0,), m5), new[0]))
                else:
                    out.extend([((m0, m1, m2, m3, ids + (k,), m5), value) for k, value in enumerate(new)])
            else:
                out.append((log.metas[j], result))
            log.outputs[j] = new

    def _diverted(self, meta: tuple, payload: Any, exc: BaseException) -> Any:
        """The output of an element whose function raised: its dead letter (a list of it, flat)."""
        letter = self.on_error(meta, payload, exc)
        return [letter] if self.flat else letter

    def _emit_diff(self, meta: tuple, old: list, new: list, out: list) -> None:
        flat = self.flat
        for k in range(max(len(old), len(new))):
            if k < len(old) and k < len(new) and old[k] == new[k]:
                continue
            m = child_of(meta, k) if flat else meta
            if k < len(old):
                out.append((tombstone_of(m), old[k]))
                self.tombstones_emitted += 1
            if k < len(new):
                out.append((m, new[k]))


class DriftingKeyedState(DriftingLogs):
    """The state of one stateful operator instance, for all its keys: a value per key,
    ``fn(state, x) -> (new_state, output)``.

    ``apply`` takes one element (or tombstone) and returns the elements to emit,
    tombstones included, as ``(meta, payload)`` pairs. ``advance(watermark)``
    folds every entry below the watermark into the backend.
    """

    def __init__(self, fn: StateFn, *, flat: bool = False, backend: Optional[StateBackend] = None,
                 on_error: Optional[Callable] = None) -> None:
        super().__init__(fn, flat, backend if backend is not None else DictBackend(), on_error)

    def _fold(self, key: Hashable, log: KeyLog, n: int) -> None:
        inputs = log.payloads[:n]
        diverted = self.diverted
        if diverted:  # a snapshot may record the inputs and re-apply them: not the failing ones
            metas = log.metas[:n]
            inputs = [p for m, p in zip(metas, inputs) if m not in diverted]
            diverted.difference_update(metas)
        self.backend.fold(key, log.after[n - 1], inputs)

    def _replay(self, key: Hashable, log: KeyLog, i: int, out: list) -> None:
        """Re-apply entries i.. of the log, emitting only the outputs that changed."""
        fn = self.fn
        state = log.after[i - 1] if i > 0 else self.backend.get(key)
        metas, payloads, states = log.metas, log.payloads, log.after
        for j in range(i, len(metas)):
            try:
                pair = fn(state, payloads[j])
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise self.not_a_state_pair(pair)
                new, result = pair
                self._record(log, j, result, out)  # a flat result that is not iterable raises here
            except Exception as exc:
                self._replay_failed(key, log, j, exc, out)
            else:
                state = new
                if self.diverted:
                    self.diverted.discard(metas[j])  # a late arrival before it changed its state
            states[j] = state

    @staticmethod
    def not_a_state_pair(returned: Any) -> TypeError:
        """The error of a state function that returned something else than ``(new_state, output)``
        (a forgotten tuple must not unpack a 2-character string as a state and an output).

        >>> DriftingKeyedState.not_a_state_pair("yw")
        TypeError("a state function returns a tuple (new_state, output); this one returned 'yw' (a str)")
        """
        text = repr(returned)
        text = text if len(text) <= 200 else f"{text[:200]}... ({len(text)} chars)"
        return TypeError(f"a state function returns a tuple (new_state, output); this one returned {text} (a {type(returned).__name__})")

    def _replay_failed(self, key: Hashable, log: KeyLog, j: int, exc: Exception, out: list) -> None:
        """Entry j's function (or recording its output) raised ``exc``: StateFnError, or with
        ``on_error`` its dead letter, the key's state left as before it."""
        if self.on_error is None:
            raise StateFnError(log.metas[j], log.payloads[j]) from exc
        self._record(log, j, self._diverted(log.metas[j], log.payloads[j], exc), out)
        self.diverted.add(log.metas[j])


if _drifting is not None:
    DriftingKeyedState._path = _drifting.InOrderPath(KeyLog, NO_OUTPUT)
