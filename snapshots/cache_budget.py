"""A :class:`~driftstream.snapshots.state_cache.StateCache`'s memory budget: what its states
hold, and eviction (clean states dropped, oldest first) then spilling (dirty states written to
RocksDB and dropped) down to :data:`LOW_WATER` of the budget. The cache's own half; apart so
that each class stays one concept (see the cache's module doc for when each may happen).
"""

from __future__ import annotations

#: Over budget, the cache drops states until it holds this fraction of the budget.
LOW_WATER = 0.9


class CacheBudget:
    """The budget side of a StateCache, on its attributes: ``budget``, ``_states``, ``_clean``
    (a CleanStates), ``_sizes`` (a MeanSize), ``_unwritten``, ``_bases_pending``, ``_deferred``
    (and ``_mark_deferred``), ``db``,
    ``complete`` and the counters ``evicted``, ``spilled``, ``read_back``."""

    @property
    def cached_bytes(self) -> int:
        """Bytes the cached states hold: measured for clean ones, the mean size for dirty ones. O(1)."""
        return self._clean.bytes + (len(self._states) - len(self._clean)) * self._sizes.mean

    @property
    def over_budget(self) -> bool:
        """True while the cache holds more than its budget: only while a base is being written
        (no dirty state may spill then; see the module doc). O(1)."""
        return self.cached_bytes > self.budget

    def _evict(self) -> None:
        """Drop clean states, then spill dirty ones, down to LOW_WATER of the budget (see module doc).
        O(1) under budget; a pass over the states it drops otherwise."""
        if self.cached_bytes <= self.budget:
            return
        if self._deferred:
            self._mark_deferred()  # written bases' rows not marked clean yet: droppable once marked
        if not self._clean and (self._bases_pending or not self._unwritten):
            return  # nothing may go: not even a walk over the slots of the emptied dict
        excess = self.cached_bytes - int(self.budget * LOW_WATER)
        before = self._clean.bytes
        victims = self._clean.drop_oldest(excess)
        states = self._states
        for key in victims:
            del states[key]
        if victims:
            self._incomplete()
        self.evicted += len(victims)
        freed = before - self._clean.bytes
        if freed < excess and not self._bases_pending:
            self._spill(excess - freed)

    def _spill(self, excess: int) -> None:
        """Write dirty states to RocksDB and drop them, about ``excess`` bytes."""
        mean, states = self._sizes.mean, self._states
        victims = []
        for key in self._unwritten:
            if len(victims) * mean >= excess:
                break
            victims.append(key)
        if victims:
            self._incomplete()
        for key in victims:
            self.db.put(key, states.pop(key))
            del self._unwritten[key]
        self.spilled += len(victims)

    def _incomplete(self) -> None:
        """RocksDB now holds states the cache does not: misses read it from here on, so its
        bulk mode (a memtable written, never read) ends now, between two writes (no iterator
        open), not at the first read."""
        self.complete = False
        self.db.end_bulk()

    def stats(self) -> dict:
        """What the cache holds and did: for ``status()`` and metrics. O(1)."""
        return {
            "records": len(self._states),
            "bytes": self.cached_bytes,
            "budget": self.budget,
            "evicted": self.evicted,
            "spilled": self.spilled,
            "read_back": self.read_back,
        }
