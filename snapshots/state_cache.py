"""A write-back cache of decoded base states in front of a :class:`RocksDBBackend`.

Folding a key into its base state happens on every watermark that passes it, and
a base state can be large (a frequent word's posting list holds thousands of
pages). Encoding and writing it on every fold would cost milliseconds each time
on the event loop. The cache keeps decoded states in memory and two records
of what changed, both taken in O(changed keys) with no encoding:

- :meth:`take_changes`, at every snapshot: the keys changed since the last one,
  each with the inputs folded into it since (:meth:`fold`), for a delta;
- :meth:`take_unwritten`, at a base: the states RocksDB does not have yet, which
  :meth:`write` then stores (in the background) before the checkpoint.

States must be immutable values (the keyed state already requires that), so a
taken batch is a consistent view of the states at T.

>>> import tempfile
>>> from driftstream.snapshots.backend import RocksDBBackend
>>> cache = StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db"))
>>> cache.fold("k", 3, [1, 2]); cache.get("k"), cache.db.get("k")      # not written yet
(3, None)
>>> cache.take_changes()
{'k': (3, [1, 2])}
>>> batch = cache.take_unwritten(); cache.write(batch); cache.mark_written(batch); cache.db.get("k")
3
>>> cache.close()

Clean states (written by a completed :meth:`write`, not changed since) are
evicted first-written-first when more than ``capacity`` keys are cached; a
later :meth:`get` reads them back from RocksDB.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator

from .backend import REMOVED, RocksDBBackend

_MISSING = object()


class StateCache:
    """Decoded base states over ``db``; writes happen only through :meth:`write`."""

    def __init__(self, db: RocksDBBackend, capacity: int = 200_000) -> None:
        self.db = db
        self.capacity = capacity
        self._states: dict = {}
        self._unwritten: set = set()  # changed since the last write to RocksDB
        # Changed since the last snapshot: key -> the inputs folded since, or None (unknown).
        self._changed: dict = {}
        # Keys whose cached value is what RocksDB holds, oldest write first (dict keeps order).
        self._clean: dict = {}

    def get(self, key: Hashable) -> Any:
        """The base state of ``key`` (None if it has none). O(1) when cached."""
        state = self._states.get(key, _MISSING)
        if state is _MISSING:
            state = self.db.get(key)
            if state is not None:
                self._states[key] = state
                self._clean[key] = None
                self._evict()
        return None if state is REMOVED else state

    def put(self, key: Hashable, state: Any) -> None:
        """Set the base state of ``key`` in memory. O(1); RocksDB sees it at the next :meth:`write`."""
        self._set(key, state)
        self._changed[key] = None

    def remove(self, key: Hashable) -> None:
        """The key has no state any more; RocksDB deletes it at the next :meth:`write`. O(1)."""
        self.put(key, REMOVED)

    def fold(self, key: Hashable, state: Any, inputs: list) -> None:
        """Set ``state``, the result of folding ``inputs`` (in order) into the key's previous
        state; a delta may then record the inputs instead of the state. O(len(inputs))."""
        self._set(key, state)
        changed = self._changed
        if key not in changed:
            changed[key] = list(inputs)
        elif changed[key] is not None:
            changed[key].extend(inputs)

    def _set(self, key: Hashable, state: Any) -> None:
        self._states[key] = state
        self._unwritten.add(key)
        self._clean.pop(key, None)
        self._evict()

    def take_changes(self) -> dict:
        """The keys changed since the last call, as ``{key: (state, inputs folded since or None)}``.
        O(changed keys)."""
        states, changed = self._states, self._changed
        self._changed = {}
        return {k: (states[k], inputs) for k, inputs in changed.items()}

    def take_unwritten(self) -> dict:
        """The states changed since the last :meth:`take_unwritten`, as ``{key: state}``, to
        :meth:`write`; O(changed keys)."""
        states = self._states
        batch = {k: states[k] for k in self._unwritten}
        self._unwritten = set()
        return batch

    def unwritten_again(self, batch: dict) -> None:
        """A :meth:`write` of ``batch`` failed: its keys go into the next :meth:`take_unwritten`."""
        self._unwritten.update(batch)

    def write(self, batch: dict) -> None:
        """Encode and store ``batch`` (from :meth:`take_unwritten`) in RocksDB. Touches no cached
        state, so the owner may go on with ``get``/``put`` between the keys of a batch written
        a few at a time (:meth:`write_item`); batches must be written in the order they were taken."""
        for item in batch.items():
            self.write_item(item)

    def write_item(self, item: tuple) -> None:
        """Encode and store one ``(key, state)`` of a batch. O(size of the state)."""
        self.db.put(*item)

    def mark_written(self, batch: dict) -> None:
        """After :meth:`write` of ``batch`` finished: its keys not changed since may be evicted.
        Call from the owner's thread (it reads the unwritten set)."""
        states, unwritten, clean = self._states, self._unwritten, self._clean
        for key, state in batch.items():
            if key not in unwritten and states.get(key, _MISSING) is state:
                clean[key] = None

    def _evict(self) -> None:
        if len(self._states) <= self.capacity or not self._clean:
            return
        for key in list(self._clean)[: max(1, len(self._states) - self.capacity)]:
            del self._clean[key]
            del self._states[key]

    def items(self) -> Iterator[tuple]:
        """Every ``(key, state)``: cached ones, then the rest from RocksDB. O(n)."""
        yield from ((k, v) for k, v in self._states.items() if v is not REMOVED)
        for key, state in self.db.items():
            if key not in self._states:
                yield key, state

    def start_flush(self) -> None:
        """Flush what :meth:`write` stored, in RocksDB's thread (see :meth:`RocksDBBackend.start_flush`)."""
        self.db.start_flush()

    def flushing(self) -> bool:
        return self.db.flushing()

    def checkpoint(self, dest_dir: Any) -> Any:
        """A RocksDB checkpoint of what has been written (see :meth:`RocksDBBackend.checkpoint`)."""
        return self.db.checkpoint(dest_dir)

    def close(self) -> None:
        self.db.close()
