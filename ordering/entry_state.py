"""Keyed state made of entries, whose per-element cost does not depend on its size.

:class:`~.keyed_state.DriftingKeyedState` keeps a whole state value per log entry:
"return a new state" costs a copy of the value, so a key whose state holds a
million entries (the posting list of a frequent word) costs a million per element.
Here the state of a key is a map of entries, changed in place through a
:class:`MapState` handle, and each change is journaled:

- the *base* (everything below the watermark) lives entry by entry in an
  :class:`EntryBackend` (a dict in tests, RocksDB in a run);
- the *overlay* holds, per entry touched by an element at or above the watermark,
  the stack of values those elements wrote, in log order;
- each log entry keeps its *journal*: the entries it wrote, in order.

A late element rolls the key back by popping the journals of the elements after
it (newest first), is applied, and the tail is re-applied: the cost is the writes
of the displaced elements, not the size of the map. When the watermark passes an
element, the bottom of each stack it wrote goes to the base. Drifting-state
semantics are those of :class:`~.keyed_state.DriftingKeyedState`: outputs that
changed are invalidated by a tombstone and emitted anew, so the output is the same
for any arrival order.

>>> def index(pages, x):                  # x: (page, positions); output: the word's df
...     page, positions = x
...     pages.put(page, positions)
...     return len(pages)
>>> ks = EntryKeyedState(index)
>>> ks.apply(Meta(2, 0, 0, 2), (7, [1]), "the")
[(Meta(ts=2, source=0, partition=0, offset=2, child_ids=(), tombstone=False), 1)]
>>> [(m[0], m[5], p) for m, p in ks.apply(Meta(1, 0, 0, 1), (5, [3]), "the")]   # late: page 5 first
[(1, False, 1), (2, True, 1), (2, False, 2)]
>>> ks.advance((3,)); ks.log_size(), sorted(ks.backend.entries("the"))
(0, [(5, [3]), (7, [1])])

Costs: a read is O(1) (the overlay, then the backend); a write is O(1) plus its
journal record; an element that lands i places before the tail costs the writes
of those i elements undone and their functions called again; ``advance`` is O(writes)
of the elements it folds. ``len`` is kept as a counter, O(1).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from itertools import count
from typing import Any, Callable, Hashable, Iterator, Optional

from .keyed_state import StateFnError
from .meta import Meta, child_of, invalidee_of, tombstone_of

#: ``fn(state_handle, element) -> output``; for flat: an iterable of outputs. None: no output.
EntryFn = Callable[[Any, Any], Any]


class _Deleted:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


#: What an overlay holds for an entry that an element removed.
DELETED = _Deleted()

#: The entry under which a key's entry count is kept (in the overlay and the backend).
SIZE = ("__driftstream_size__",)


class DictEntryBackend:
    """Base entries in a dict: the backend for unit tests and the simulator.

    The protocol: ``get(key, entry)`` (``DELETED`` when missing), ``put(key, entry, value)``,
    ``delete(key, entry)``, ``fold(key, inputs)`` (the inputs whose writes were just put:
    a snapshotting backend records them for a delta), ``entries(key)`` (every entry,
    O(entries): for inspection and tests).

    >>> b = DictEntryBackend(); b.put("k", "a", 1); b.get("k", "a"), b.get("k", "b")
    (1, DELETED)
    """

    def __init__(self) -> None:
        self._data: dict = {}

    def get(self, key: Hashable, entry: Hashable) -> Any:
        return self._data.get((key, entry), DELETED)

    def put(self, key: Hashable, entry: Hashable, value: Any) -> None:
        self._data[(key, entry)] = value

    def delete(self, key: Hashable, entry: Hashable) -> None:
        self._data.pop((key, entry), None)

    def fold(self, key: Hashable, inputs: list) -> None:
        pass

    def entries(self, key: Hashable) -> Iterator[tuple]:
        return ((e, v) for (k, e), v in self._data.items() if k == key and e != SIZE)


class MapState:
    """The state of one key as seen by one element: a map of entries.

    ``get(entry, default=None)``, ``put(entry, value)``, ``remove(entry)``, ``entry in
    state``, ``len(state)``: each O(1). Values are stored as given and must not be
    mutated afterwards (a rollback restores the value written before): write a new
    value instead.
    """

    __slots__ = ("_owner", "_key", "_journal")

    def __init__(self, owner: "EntryKeyedState", key: Hashable, journal: list) -> None:
        self._owner, self._key, self._journal = owner, key, journal

    def get(self, entry: Hashable, default: Any = None) -> Any:
        value = self._owner._read(self._key, entry)
        return default if value is DELETED else value

    def __contains__(self, entry: Hashable) -> bool:
        return self._owner._read(self._key, entry) is not DELETED

    def __len__(self) -> int:
        size = self._owner._read(self._key, SIZE)
        return 0 if size is DELETED else size

    def put(self, entry: Hashable, value: Any) -> None:
        if entry == SIZE:
            raise ValueError(f"{SIZE!r} is reserved")
        if self._owner._read(self._key, entry) is DELETED:
            self._write(SIZE, len(self) + 1)
        self._write(entry, value)

    def remove(self, entry: Hashable) -> None:
        """Remove ``entry`` if present."""
        if self._owner._read(self._key, entry) is not DELETED:
            self._write(SIZE, len(self) - 1)
            self._write(entry, DELETED)

    def _write(self, entry: Hashable, value: Any) -> None:
        self._owner._push(self._key, entry, value)
        self._journal.append(entry)


class _KeyLog:
    """The elements of one key at or above the watermark, sorted by Meta, each with its
    journal (the entries it wrote, in order) and its outputs."""

    __slots__ = ("metas", "payloads", "journals", "outputs")

    def __init__(self) -> None:
        self.metas: list = []
        self.payloads: list = []
        self.journals: list = []
        self.outputs: list = []

    def insert(self, meta: tuple, payload: Any) -> int:
        metas = self.metas
        i = len(metas) if not metas or metas[-1] <= meta else bisect_right(metas, meta)
        metas.insert(i, meta)
        self.payloads.insert(i, payload)
        self.journals.insert(i, None)  # not applied yet: nothing to undo
        self.outputs.insert(i, _NO_OUTPUT)
        return i

    def remove(self, i: int) -> tuple:
        del self.metas[i], self.payloads[i]
        return self.journals.pop(i), self.outputs.pop(i)

    def find(self, meta: tuple, payload: Any) -> int:
        metas = self.metas
        i = bisect_left(metas, meta)
        while i < len(metas) and metas[i] == meta:
            if self.payloads[i] == payload:
                return i
            i += 1
        return -1


_NO_OUTPUT: list = []


class EntryKeyedState:
    """Order-sensitive keyed state of entries, for all keys of one operator instance.

    ``apply`` / ``apply_batch`` take elements (or tombstones) and return what to emit;
    ``advance(watermark)`` moves what the watermark passed into the backend. ``fn``
    gets a :class:`MapState` and the element and returns the output (None: nothing;
    with ``flat``, an iterable of outputs).
    """

    def __init__(self, fn: EntryFn, *, flat: bool = False, backend: Any = None) -> None:
        self.fn = fn
        self.flat = flat
        self.backend = backend if backend is not None else DictEntryBackend()
        self.logs: dict = {}
        self.overlay: dict = {}  # (key, entry) -> deque of values written by elements in the log, in log order
        self.pending_tombstones: dict = {}
        self._heap: list = []
        self._seq = count()
        self._size = 0
        self.tombstones_emitted = 0

    def log_size(self) -> int:
        """Elements held in memory over all keys (O(1))."""
        return self._size

    # -- the handle's side ----------------------------------------------------------------

    def _read(self, key: Hashable, entry: Hashable) -> Any:
        stack = self.overlay.get((key, entry))
        return stack[-1] if stack else self.backend.get(key, entry)

    def _push(self, key: Hashable, entry: Hashable, value: Any) -> None:
        stack = self.overlay.get((key, entry))
        if stack is None:
            stack = self.overlay[(key, entry)] = deque()
        stack.append(value)

    def _undo(self, key: Hashable, journal: Optional[list]) -> None:
        """Pop what one element wrote (it is the newest applied element of its key)."""
        if not journal:
            return
        overlay = self.overlay
        for entry in reversed(journal):
            stack = overlay[(key, entry)]
            stack.pop()
            if not stack:
                del overlay[(key, entry)]

    # -- elements in ------------------------------------------------------------------------

    def apply(self, meta: Meta, payload: Any, key: Hashable) -> list:
        return self.apply_batch([(meta, payload, key)])

    def apply_batch(self, items: list) -> list:
        """Take ``(meta, payload, key)`` elements and tombstones; return what to emit.
        Each touched key is re-applied once, from its earliest change."""
        out: list = []
        touched: dict = {}
        for meta, payload, key in items:
            i = self._land(meta, payload, key, out)
            if i >= 0 and (key not in touched or i < touched[key]):
                touched[key] = i
        for key, i in touched.items():
            log = self.logs.get(key)
            if log is None:
                continue
            self._replay(key, log, i, out)
            if not log.metas:
                del self.logs[key]
        return out

    def _land(self, meta: tuple, payload: Any, key: Hashable, out: list) -> int:
        log = self.logs.get(key)
        if meta[5]:
            invalidee = invalidee_of(meta)
            i = log.find(invalidee, payload) if log is not None else -1
            if i < 0:
                self.pending_tombstones.setdefault(key, []).append((invalidee, payload))
                return -1
            # Undo the tail down to the invalidee (newest first), then drop it: the
            # replay from i re-applies what followed it.
            for j in range(len(log.metas) - 1, i - 1, -1):
                self._undo(key, log.journals[j])
                log.journals[j] = None
            _, outputs = log.remove(i)
            self._size -= 1
            self._emit_diff(invalidee, outputs, _NO_OUTPUT, out)
            return i
        if self.pending_tombstones:
            pending = self.pending_tombstones.get(key)
            if pending and (meta, payload) in pending:
                pending.remove((meta, payload))
                if not pending:
                    del self.pending_tombstones[key]
                return -1
        if log is None:
            log = self.logs[key] = _KeyLog()
        i = log.insert(meta, payload)
        if i < len(log.metas) - 1:
            # Landed before applied elements: roll them back, newest first.
            for j in range(len(log.metas) - 1, i, -1):
                self._undo(key, log.journals[j])
                log.journals[j] = None
        self._size += 1
        if i == 0:
            heapq.heappush(self._heap, (meta, next(self._seq), key))
        return i

    def _replay(self, key: Hashable, log: _KeyLog, i: int, out: list) -> None:
        """Apply entries i.. of the log (every one of them is rolled back), emitting only
        the outputs that changed."""
        fn, flat = self.fn, self.flat
        metas, payloads, journals, outputs = log.metas, log.payloads, log.journals, log.outputs
        for j in range(i, len(metas)):
            if journals[j] is not None:
                continue  # still applied: it precedes every change
            journal: list = []
            journals[j] = journal
            try:
                result = fn(MapState(self, key, journal), payloads[j])
                if flat:
                    new = list(result) if result is not None else _NO_OUTPUT
                else:
                    new = _NO_OUTPUT if result is None else [result]
            except Exception as exc:
                self._undo(key, journal)
                journals[j] = None
                raise StateFnError(metas[j], payloads[j]) from exc
            old = outputs[j]
            if new != old:
                if not old and not flat:
                    out.append((metas[j], result))
                else:
                    self._emit_diff(metas[j], old, new, out)
                outputs[j] = new

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

    # -- the watermark ----------------------------------------------------------------------

    def advance(self, watermark: tuple) -> None:
        """Move the writes of every element below ``watermark`` into the backend, in log
        order, and forget those elements. O(their writes)."""
        heap, logs, overlay, backend = self._heap, self.logs, self.overlay, self.backend
        while heap and heap[0][0] < watermark:
            key = heapq.heappop(heap)[2]
            log = logs.get(key)
            if log is None:
                continue
            metas = log.metas
            if not metas[0] < watermark:
                heapq.heappush(heap, (metas[0], next(self._seq), key))
                continue
            n = len(metas) if metas[-1] < watermark else bisect_left(metas, watermark)
            for journal in log.journals[:n]:
                for entry in journal:
                    stack = overlay[(key, entry)]
                    value = stack.popleft()
                    if not stack:
                        del overlay[(key, entry)]
                    if value is DELETED:
                        backend.delete(key, entry)
                    else:
                        backend.put(key, entry, value)
            backend.fold(key, log.payloads[:n])
            del metas[:n], log.payloads[:n], log.journals[:n], log.outputs[:n]
            self._size -= n
            if metas:
                heapq.heappush(heap, (metas[0], next(self._seq), key))
            else:
                del logs[key]
        if self.pending_tombstones:
            for pending in self.pending_tombstones.values():
                for invalidee, _ in pending:
                    if invalidee < watermark:
                        raise AssertionError(f"tombstone for {invalidee} below the watermark never met its element")
