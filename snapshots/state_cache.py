"""A write-back cache of decoded settled states in front of a :class:`RocksDBBackend`, within a memory budget.

Folding a key into its settled state happens on every watermark that passes it, and
a settled state can be large (a frequent word's posting list holds thousands of
pages). Encoding and writing it on every fold would cost milliseconds each time
on the event loop. The cache keeps decoded states in memory and two records
of what changed, both taken in O(changed keys) with no encoding:

- :meth:`take_changes`, at every snapshot: the keys changed since the last one,
  each with the inputs folded into it since (:meth:`fold`), for a delta; or None
  once more than ``max_delta_keys`` changed: a delta that large costs about what a
  base does, and the base still had to follow it (a backlog wrote every entry twice).
  The record then stops growing until the next snapshot, which writes a base;
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

The budget (``budget_bytes``, :func:`~driftstream.snapshots.memory_size.approx_size`
of the cached states plus :data:`~.memory_size.RECORD_OVERHEAD` each) bounds the memory the
cached states hold. Over it, the cache drops clean states (RocksDB holds them),
oldest written first; if that is not enough, it writes dirty states to RocksDB
and drops them too ("spills"), but none while a base is being written (its
checkpoint must not see states later than its snapshot). A delta reads a spilled
state back from RocksDB, where it is the latest one. A later :meth:`get` reads a dropped
state back. It drops down to :data:`LOW_WATER` of the budget at once, so a pass
over the cache is rare.

A miss needs no RocksDB read while RocksDB holds no record of a key the cache has
not seen: the database was empty when the cache opened it (not a restore) and the
cache has dropped nothing since, so everything RocksDB holds was written from the
cache and is still in it. A key missing from the cache then has no state. Entry
state reads every new entry once (is it in the map?), so a fresh instance within
its budget saves a RocksDB read (and the key's encoding, ~3 us) per new entry.
The first drop ends this for the cache's life (:attr:`StateCache.complete`).
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Iterator, Optional

from driftstream.ordering.accelerators import accelerator

from .backend import RocksDBBackend
from .changelog import REMOVED
from .cache_budget import LOW_WATER, CacheBudget  # noqa: F401 - LOW_WATER: the budget's, named here too
from .clean_states import CleanStates
from .memory_size import DEFAULT_BUDGET_BYTES, MeanSize

_written = accelerator("driftstream.snapshots._written")
#: mark_items_written's and put_many's loops in C (snapshots/_written.c), or None: the loops below alone
_mark_clean = None if _written is None else _written.mark_clean
_put_all = None if _written is None else _written.put_all

_MISSING = object()

#: Keys changed since the last snapshot beyond which it writes a base instead of a delta (see
#: :meth:`StateCache.take_changes`). A delta row costs ~4 us to encode, a base row ~5-13 us
#: plus 15-20 ms of flush and checkpoint: at this size a base is no dearer than the delta
#: and the later base it saves.
MAX_DELTA_KEYS = 4096

#: A written base's rows are marked clean only once the cache, with the rows of the written
#: bases not yet marked counted again at the mean size, holds this fraction of its budget (see
#: :meth:`StateCache.written`): the budget's low water, so what waits stays within the budget.
DEFER_MARKS_BELOW = LOW_WATER


class StateCache(CacheBudget):
    """Decoded settled states over ``db``; writes happen through :meth:`write`, or a spill.

    ``track_changes=False``: no snapshot will ask for :meth:`take_changes` (a run
    without snapshots), so nothing is kept for deltas and every dirty state may spill.
    """

    def __init__(self, db: RocksDBBackend, budget_bytes: int = DEFAULT_BUDGET_BYTES, track_changes: bool = True,
                 max_delta_keys: int = MAX_DELTA_KEYS) -> None:
        self.db = db
        self.budget = budget_bytes
        self.track_changes = track_changes
        self.max_delta_keys = max_delta_keys
        self._states: dict = {}
        # Changed since the last write to RocksDB, with their states: a base takes it whole.
        self._unwritten: dict = {}
        # Changed since the last snapshot: key -> the inputs folded since, or None (unknown).
        # None instead of the dict: not recorded (no snapshots, or too many changed for a delta).
        self._changed: Optional[dict] = {} if track_changes else None
        # Keys whose cached value is what RocksDB holds: what a drop may take.
        self._clean = CleanStates()
        # Sizes measured by write_items, taken by mark_items_written.
        self._written_sizes: dict = {}
        # Written bases whose rows are not marked clean yet, oldest first: (batch, its sizes).
        self._deferred: list = []
        self._deferred_rows = 0
        # A dirty state (and a clean one not measured) counts at the mean size of those measured.
        self._sizes = MeanSize()
        # Bases taken and not yet written or given back: no spill while one is pending. A count,
        # as a base may be taken while the one before is still being written (a backlog).
        self._bases_pending = 0
        self.evicted = self.spilled = self.read_back = 0
        #: whether :meth:`mark_items_written` and :meth:`put_many` run their loops in C (False:
        #: the Python, the reference)
        self.native = _written is not None
        #: True while every record RocksDB holds has its key in the cache (see the module doc):
        #: a miss is then a key with no state. An empty database opens complete; a drop
        #: (eviction or spill) ends it.
        self.complete = db.is_empty()

    # -- reads and writes -------------------------------------------------------------------

    def get(self, key: Hashable) -> Any:
        """The settled state of ``key`` (None if it has none). O(1) when cached; else one RocksDB read."""
        state = self._states.get(key, _MISSING)
        if state is _MISSING:
            if self.complete:
                return None
            state = self.db.get(key)
            if state is not None:
                self.read_back += 1
                self._states[key] = state
                self._clean.add(key, self._sizes.measure(state))
                self._evict()
        return None if state is REMOVED else state

    def read_view(self) -> tuple:
        """``(states, removed)``: the decoded states by key (for reading only; a removed key's is
        ``removed``) and the mark of a removed key. A key missing from them has no state while
        :attr:`complete` holds; else :meth:`get` reads it from RocksDB. O(1)."""
        return self._states, REMOVED

    def put(self, key: Hashable, state: Any) -> None:
        """Set the settled state of ``key`` in memory. O(1); RocksDB sees it at the next :meth:`write`."""
        self.put_many(((key, state),))

    def put_many(self, pairs: Iterable[tuple], deleted: Any = REMOVED) -> None:
        """:meth:`put` of each ``(key, state)`` (``deleted``, the caller's mark of a removed key,
        REMOVED by default: removed), with one budget check after them all: entry state folds
        a key's writes (the index: a page and the word's size) together. O(pairs).

        >>> import tempfile
        >>> from driftstream.snapshots.backend import RocksDBBackend
        >>> cache = StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db"))
        >>> cache.put_many([("a", 1), ("b", 2), ("a", REMOVED)]); cache.get("a"), cache.get("b"), cache.take_changes()
        (None, 2, {'a': (REMOVED, None), 'b': (2, None)})
        >>> cache.close()
        """
        changed, states, unwritten, pop_clean = self._changed, self._states, self._unwritten, self._clean.sizes.pop
        measured, freed = self._sizes, 0
        measure = measured.measuring_all
        if self.native and not measure:
            freed = _put_all(pairs, deleted, REMOVED, changed, states, unwritten, self._clean.sizes)  # takes any iterable
        else:
            for key, state in pairs:  # _set, inlined: a fold puts every entry the watermark passed
                if state is deleted:
                    state = REMOVED
                if changed is not None:
                    changed[key] = None
                states[key] = state
                unwritten[key] = state
                if measure:
                    measured.measure(state)
                size = pop_clean(key, None)
                if size is not None:
                    freed += size
        self._clean.changed_by(-freed)
        if changed is not None and len(changed) > self.max_delta_keys:
            self._changed = None
        self._evict()

    def remove(self, key: Hashable) -> None:
        """The key has no state any more; RocksDB deletes it at the next :meth:`write`. O(1)."""
        self.put(key, REMOVED)

    def remove_many(self, keys: Iterable[Hashable]) -> None:
        """:meth:`remove` of each key, with one budget check: the windows (or panes) a
        watermark passed, often thousands at a time in a backlog. O(keys)."""
        self.put_many([(key, REMOVED) for key in keys])

    def fold(self, key: Hashable, state: Any, inputs: list) -> None:
        """Set ``state``, the result of folding ``inputs`` (in order) into the key's previous
        state; a delta may then record the inputs instead of the state. O(len(inputs))."""
        changed = self._changed
        if changed is not None:
            if key not in changed:
                changed[key] = list(inputs)
                if len(changed) > self.max_delta_keys:
                    self._changed = None
            elif changed[key] is not None:
                changed[key].extend(inputs)
        self._set(key, state)
        self._evict()

    def _set(self, key: Hashable, state: Any) -> None:
        """Set a dirty state (the caller has recorded the change for deltas, and checks the budget)."""
        self._states[key] = state
        self._unwritten[key] = state
        if self._sizes.measuring_all:
            self._sizes.measure(state)
        self._clean.discard(key)

    # -- snapshots --------------------------------------------------------------------------

    def take_changes(self) -> Optional[dict]:
        """The keys changed since the last call, as ``{key: (state, inputs folded since or None)}``,
        or None if more than ``max_delta_keys`` did (the snapshot must write a base). O(changed keys).

        >>> import tempfile
        >>> from driftstream.snapshots.backend import RocksDBBackend
        >>> cache = StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db"), max_delta_keys=2)
        >>> cache.put("a", 1); cache.put("b", 2); cache.take_changes()
        {'a': (1, None), 'b': (2, None)}
        >>> for k in "xyz": cache.put(k, 0)
        >>> cache.take_changes() is None, cache.take_changes()
        (True, {})
        >>> cache.close()
        """
        if not self.track_changes:
            return {}
        changed, self._changed = self._changed, {}
        if changed is None:
            return None
        return {k: (self._latest(k), inputs) for k, inputs in changed.items()}

    def _latest(self, key: Hashable) -> Any:
        """The state of ``key`` now: cached, or spilled to RocksDB (REMOVED if it has none)."""
        state = self._states.get(key, _MISSING)
        if state is _MISSING:
            state = self.db.get(key)
            return REMOVED if state is None else state
        return state

    def take_unwritten(self) -> dict:
        """The states changed since the last :meth:`take_unwritten`, as ``{key: state}``, to
        :meth:`write`; O(1). No state spills until :meth:`mark_written` (or :meth:`end_write`) or
        :meth:`unwritten_again` says the batch is done."""
        batch, self._unwritten = self._unwritten, {}
        self._bases_pending += 1
        return batch

    def unwritten_again(self, batch: dict) -> None:
        """A :meth:`write` of ``batch`` failed: its keys go into the next :meth:`take_unwritten`."""
        unwritten, states = self._unwritten, self._states
        for key, state in batch.items():
            if key not in unwritten:  # else set again since: the newer state is the one to write
                unwritten[key] = states.get(key, state)
        self._written_sizes.clear()
        self._bases_pending = max(0, self._bases_pending - 1)

    def write(self, batch: dict) -> None:
        """Encode and store ``batch`` (from :meth:`take_unwritten`) in RocksDB. Touches no cached
        state, so the owner may go on with ``get``/``put`` between the slices of a batch written
        a few items at a time (:meth:`write_items`); batches must be written in the order they were taken."""
        self.write_items(list(batch.items()))

    def write_items(self, items: list) -> None:
        """Encode and store some ``(key, state)`` of a batch in one RocksDB write, and measure
        a sample of them (:meth:`.MeanSize.sample`: the rest count at the mean once clean).
        O(size of the states)."""
        self.db.put_many(items)
        self._sizes.sample(items, self._written_sizes)

    def mark_written(self, batch: dict) -> None:
        """After :meth:`write` of ``batch`` finished: its keys not changed since are clean (they
        may be dropped). Call from the owner's thread (it reads the unwritten set).
        O(batch): a writer that must not hold its thread that long calls
        :meth:`mark_items_written` a few items at a time, then :meth:`end_write`."""
        self.mark_items_written(batch.items())
        self.end_write()

    def written(self, batch: dict) -> list:
        """After every write of a base's ``batch``: the written batches whose rows the caller marks
        clean now, oldest first, as ``(batch, sizes)`` for :meth:`mark_items_written` (a slice at
        a time; then :meth:`end_write`), or [] while the marks wait. O(1).

        Marking is dict work on the cache's largest dicts, ~0.3 us a row (a third of a base's
        cost once its keys are packed in C), and only a drop needs it. So while the cache and
        the waiting rows (again, at the mean size: a batch holds states since replaced) stay below
        :data:`DEFER_MARKS_BELOW` of the budget, they wait; the first base past it marks them
        all, in order, and then each base its own. A cache over budget marks them before it
        drops anything (:meth:`_mark_deferred`). Until marked, a removed state stays cached.

        >>> import tempfile
        >>> from driftstream.snapshots.backend import RocksDBBackend
        >>> cache = StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db"), budget_bytes=10**6)
        >>> cache.put("k", 1); batch = cache.take_unwritten(); cache.write(batch)
        >>> cache.written(batch), len(cache._clean)       # far below the budget: the marks wait
        ([], 0)
        >>> cache.budget = 400; due = cache.written({}); [len(b) for b, _ in due]   # past its low water
        [1, 0]
        >>> for b, sizes in due: cache.mark_items_written(b.items(), sizes)
        >>> cache.end_write(); len(cache._clean)
        1
        >>> cache.close()
        """
        self._deferred.append((batch, self._written_sizes))
        self._written_sizes = {}
        self._deferred_rows += len(batch)
        if self.cached_bytes + self._deferred_rows * self._sizes.mean <= self.budget * DEFER_MARKS_BELOW:
            return []
        due, self._deferred, self._deferred_rows = self._deferred, [], 0
        return due

    def _mark_deferred(self) -> None:
        """Mark every written batch still waiting (:meth:`written`), at once: O(their rows)."""
        due, self._deferred, self._deferred_rows = self._deferred, [], 0
        for batch, sizes in due:
            self.mark_items_written(batch.items(), sizes)

    def mark_items_written(self, items: Iterable[tuple], sizes: Optional[dict] = None) -> None:
        """Some ``(key, state)`` of a written batch: each clean unless changed since it was
        taken. The owner may go on with ``get``/``put`` between calls (12k rows: ~12 ms in one go).
        ``sizes``: the batch's measured sizes (:meth:`written`'s; default: the last batch written's)."""
        sizes = self._written_sizes if sizes is None else sizes
        unwritten, states, clean = self._unwritten, self._states, self._clean.sizes
        if self.native:
            self._clean.changed_by(_mark_clean(items, sizes, unwritten, states, clean, self._sizes.mean, REMOVED))
            return
        mean, added = self._sizes.mean, 0
        for key, state in items:
            size = sizes.pop(key, mean) if sizes else mean
            if key not in unwritten and states.get(key, _MISSING) is state and key not in clean:
                if state is REMOVED:
                    # RocksDB deleted it: a miss says the same (no read if complete, a None if not).
                    # Kept, every closed window's key stayed cached for the run's life.
                    del states[key]
                else:
                    clean[key] = size
                    added += size
        self._clean.changed_by(added)

    def end_write(self) -> None:
        """After the last :meth:`mark_items_written` of a batch: states may spill again."""
        self._written_sizes.clear()
        self._bases_pending = max(0, self._bases_pending - 1)
        self._evict()

    # -- the rest ---------------------------------------------------------------------------

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
