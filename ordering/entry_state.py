"""Keyed state made of entries, whose per-element cost does not depend on its size.

:class:`~.keyed_state.DriftingKeyedState` keeps a whole state value per log entry:
"return a new state" costs a copy of the value, so a key whose state holds a
million entries (the posting list of a frequent word) costs a million per element.
Here the state of a key is a map of entries, changed in place through a
:class:`MapState` handle, and each change is journaled:

- the *settled* entries (everything below the watermark) live one by one in an
  :class:`EntryBackend` (a dict in tests, RocksDB in a run);
- the *overlay* holds, per entry touched by an element at or above the watermark,
  the stack of values those elements wrote, in log order;
- each log entry keeps its *journal*: the entries it wrote, in order.

A late element rolls the key back by popping the journals of the elements after
it (newest first), is applied, and the tail is re-applied: the cost is the writes
of the displaced elements, not the size of the map. When the watermark passes an
element, the bottom of each stack it wrote goes to the backend. Drifting-state
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
of the elements it folds, in one call of the backend's ``fold``. ``len`` is kept as a counter, O(1).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterator, Optional, Protocol, runtime_checkable

from .keyed_state import NO_OUTPUT, DriftingLogs, KeyLog, StateFnError, _drifting
from .meta import Meta  # noqa: F401  (used by the doctest)

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


@runtime_checkable
class EntryBackend(Protocol):
    """Where an entry state's settled entries live: :class:`DictEntryBackend` (tests, the
    simulator) and ``snapshots.entry_cache.CachedEntries`` (a StateCache over RocksDB).
    ``get((key, entry))`` (:data:`DELETED` when missing), ``fold(writes)`` (``((key, entry),
    value or DELETED)`` pairs, in order) and ``entries(key)`` (``(entry, value)`` pairs)."""

    def get(self, record: tuple) -> Any: ...

    def fold(self, writes: list) -> None: ...

    def entries(self, key: Hashable) -> Iterator[tuple]: ...


class DictEntryBackend:
    """Base entries in a dict: the backend for unit tests and the simulator.

    The protocol, over records ``(key, entry)``: ``get(record)`` (``DELETED`` when missing),
    ``fold(writes)`` (the ``(record, value or DELETED)`` writes of the elements an advance
    passed, of every key, to store in order: one call per advance, not one per key or write),
    ``entries(key)`` (every entry, O(entries): for inspection and tests). Records are the
    tuples the overlay holds (a backend keyed by them makes none of its own). A backend may
    also offer ``read_view()`` (see :meth:`.CachedEntries.read_view`): the in-order path in C
    then reads the records it holds without calling ``get``. ``put`` and ``delete`` are this
    backend's own, to fill it by hand.

    >>> b = DictEntryBackend(); b.put("k", "a", 1); b.fold([(("k", "b"), 2), (("k", "a"), DELETED)])
    >>> b.get(("k", "a")), b.get(("k", "b"))
    (DELETED, 2)
    """

    def __init__(self) -> None:
        self._data: dict = {}

    def get(self, record: tuple) -> Any:
        return self._data.get(record, DELETED)

    def put(self, key: Hashable, entry: Hashable, value: Any) -> None:
        self._data[(key, entry)] = value

    def delete(self, key: Hashable, entry: Hashable) -> None:
        self._data.pop((key, entry), None)

    def fold(self, writes: list) -> None:
        data = self._data
        for record, value in writes:
            if value is DELETED:
                data.pop(record, None)
            else:
                data[record] = value

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
        if value is None:
            raise ValueError(f"MapState.put({entry!r}, None): an entry's value cannot be None; remove(entry) deletes it")
        if entry == SIZE:
            raise ValueError(f"{SIZE!r} is reserved")
        self._owner._write(self._key, entry, value, self._journal)

    def remove(self, entry: Hashable) -> None:
        """Remove ``entry`` if present."""
        self._owner._write(self._key, entry, DELETED, self._journal)


class EntryKeyedState(DriftingLogs):
    """Order-sensitive keyed state of entries, for all keys of one operator instance.

    ``apply`` / ``apply_batch`` take elements (or tombstones) and return what to emit;
    ``advance(watermark)`` moves what the watermark passed into the backend. ``fn``
    gets a :class:`MapState` and the element and returns the output (None: nothing;
    with ``flat``, an iterable of outputs). A log entry's ``after`` is its journal.
    """

    def __init__(self, fn: EntryFn, *, flat: bool = False, backend: Optional[EntryBackend] = None,
                 on_error: Optional[Callable] = None) -> None:
        super().__init__(fn, flat, backend if backend is not None else DictEntryBackend(), on_error)
        self.overlay: dict = {}  # (key, entry) -> list of values written by elements in the log, in log order
        self._folding: list = []  # the writes of the keys the advance in progress folded

    def _read(self, key: Hashable, entry: Hashable) -> Any:
        record = (key, entry)
        stack = self.overlay.get(record)
        return stack[-1] if stack else self.backend.get(record)

    def _write(self, key: Hashable, entry: Hashable, value: Any, journal: list) -> None:
        """Write ``value`` (DELETED: remove) over the entry and journal it, keeping the key's
        size entry; removing a missing entry writes nothing. One function for the in-order
        path of every element: the index's put was six calls deep through the handle."""
        overlay, record = self.overlay, (key, entry)
        stack = overlay.get(record)  # never empty: an emptied stack leaves the overlay
        old = stack[-1] if stack else self.backend.get(record)
        if (old is DELETED) is (value is DELETED):  # present -> present, or missing -> missing
            if value is DELETED:
                return
        else:
            size_record = (key, SIZE)
            sizes = overlay.get(size_record)
            size = sizes[-1] if sizes else self.backend.get(size_record)
            size = (0 if size is DELETED else size) + (-1 if value is DELETED else 1)
            if sizes:
                sizes.append(size)
            else:
                overlay[size_record] = [size]
            journal.append(SIZE)
        if stack:
            stack.append(value)
        else:
            overlay[record] = [value]
        journal.append(entry)

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

    def _roll_back(self, key: Hashable, log: KeyLog, i: int) -> None:
        """Undo the writes of entries i.. of the log, newest first. The applied entries of a log
        are a prefix of it (an element lands unapplied, and what lies after it is rolled back),
        so the first one not applied ends the work: a late element landing among many that
        wait to be re-applied costs the writes it undoes, not a pass over the waiting ones."""
        journals = log.after
        end, n = i, len(journals)
        while end < n and journals[end] is not None:
            end += 1
        for j in range(end - 1, i - 1, -1):
            self._undo(key, journals[j])
            journals[j] = None

    def _replay(self, key: Hashable, log: KeyLog, i: int, out: list) -> None:
        """Apply entries i.. of the log (all rolled back), emitting only the outputs that changed."""
        fn, metas, payloads, journals = self.fn, log.metas, log.payloads, log.after
        for j in range(i, len(metas)):
            journal: list = []
            journals[j] = journal
            try:
                self._record(log, j, fn(MapState(self, key, journal), payloads[j]), out)
            except Exception as exc:
                self._replay_failed(key, log, j, exc, out)

    def _replay_failed(self, key: Hashable, log: KeyLog, j: int, exc: Exception, out: list) -> None:
        """Entry j's function (or recording its output) raised ``exc``: StateFnError, or with
        ``on_error`` its dead letter, its writes undone (the entries as if it had not come)."""
        self._roll_back(key, log, j)
        if self.on_error is None:
            raise StateFnError(log.metas[j], log.payloads[j]) from exc
        log.after[j] = []
        self._record(log, j, self._diverted(log.metas[j], log.payloads[j], exc), out)

    def _fold(self, key: Hashable, log: KeyLog, n: int) -> None:
        """Move the writes of the first n entries out of the overlay, in log order, to go to the
        backend with every other key's when the advance ends (:meth:`_folded`). O(writes).

        When the n are the key's whole log (the common case), every overlay stack of the key
        holds their values only: each record leaves with its last value, one write (a word's
        size entry, written by each of its n elements, goes once, not n times)."""
        pop, overlay = self.overlay.pop, self.overlay
        append = self._folding.append
        if n == len(log.metas):
            for journal in log.after:
                for entry in journal:
                    stack = pop((key, entry), None)
                    if stack is not None:  # else it left with its last value already
                        append(((key, entry), stack[-1]))
            return
        for journal in log.after[:n]:
            for entry in journal:
                record = (key, entry)
                stack = pop(record)  # one lookup: an entry written once in the log (the common case) leaves
                append((record, stack[0]))
                if len(stack) > 1:
                    del stack[0]  # a list, not a deque: stacks hold a value or a few, and a
                    overlay[record] = stack  # deque costs 760 bytes (two per element in flight)

    def _folded(self) -> None:
        writes, self._folding = self._folding, []
        if writes:
            self.backend.fold(writes)


if _drifting is not None:
    EntryKeyedState._path = _drifting.InOrderPath(KeyLog, NO_OUTPUT, DELETED, SIZE)
