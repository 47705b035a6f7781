"""A write-back cache of decoded base states in front of a :class:`RocksDBBackend`.

Folding a key into its base state happens on every watermark that passes it, and
a base state can be large (a frequent word's posting list holds thousands of
pages). Encoding and writing it on every fold would cost milliseconds each time
on the event loop. The cache keeps decoded states in memory; a snapshot takes
the keys changed since the last one (:meth:`take_dirty`, O(changed keys), no
encoding) and writes them in the background (:meth:`write`) before the RocksDB
checkpoint. States must be immutable values (the keyed state already requires
that), so the taken batch is a consistent view of the states at T.

>>> import tempfile
>>> from driftstream.snapshots.backend import RocksDBBackend
>>> cache = StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db"))
>>> cache.put("k", 1); cache.get("k"), cache.db.get("k")      # not written yet
(1, None)
>>> batch = cache.take_dirty(); _ = cache.write(batch); cache.mark_written(batch); cache.db.get("k")
1
>>> cache.close()

Clean states (written by a completed :meth:`write`, not changed since) are
evicted first-written-first when more than ``capacity`` keys are cached; a
later :meth:`get` reads them back from RocksDB.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator

from .backend import RocksDBBackend

_MISSING = object()


class StateCache:
    """Decoded base states over ``db``; writes happen only through :meth:`write`."""

    def __init__(self, db: RocksDBBackend, capacity: int = 200_000) -> None:
        self.db = db
        self.capacity = capacity
        self._states: dict = {}
        self._dirty: set = set()
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
        return state

    def put(self, key: Hashable, state: Any) -> None:
        """Set the base state of ``key`` in memory. O(1); RocksDB sees it at the next :meth:`write`."""
        self._states[key] = state
        self._dirty.add(key)
        self._clean.pop(key, None)
        self._evict()

    def take_dirty(self) -> dict:
        """The states changed since the last call, as ``{key: state}``; O(changed keys)."""
        states = self._states
        batch = {k: states[k] for k in self._dirty}
        self._dirty = set()
        return batch

    def write(self, batch: dict) -> list:
        """Encode and store ``batch`` in RocksDB; returns the encoded ``(key, state)`` byte pairs
        (what a snapshot delta holds). Touches no cached state, so it may run in a thread while
        the owner goes on with ``get``/``put``; batches must be written in the order they were taken."""
        pairs = self.db.encode_states(batch)
        self.db.put_encoded(pairs)
        return pairs

    def mark_written(self, batch: dict) -> None:
        """After :meth:`write` of ``batch`` finished: its keys not changed since may be evicted.
        Call from the owner's thread (it reads the dirty set)."""
        states, dirty, clean = self._states, self._dirty, self._clean
        for key, state in batch.items():
            if key not in dirty and states.get(key, _MISSING) is state:
                clean[key] = None

    def _evict(self) -> None:
        if len(self._states) <= self.capacity or not self._clean:
            return
        for key in list(self._clean)[: max(1, len(self._states) - self.capacity)]:
            del self._clean[key]
            del self._states[key]

    def items(self) -> Iterator[tuple]:
        """Every ``(key, state)``: cached ones, then the rest from RocksDB. O(n)."""
        yield from self._states.items()
        for key, state in self.db.items():
            if key not in self._states:
                yield key, state

    def checkpoint(self, dest_dir: Any) -> Any:
        """A RocksDB checkpoint of what has been written (see :meth:`RocksDBBackend.checkpoint`)."""
        return self.db.checkpoint(dest_dir)

    def close(self) -> None:
        self.db.close()
