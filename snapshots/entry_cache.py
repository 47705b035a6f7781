"""Entry state (:class:`~driftstream.ordering.entry_state.EntryKeyedState`) over a
:class:`~driftstream.snapshots.state_cache.StateCache`: each entry of a key is one record,
``(key, entry)``, so a snapshot writes the entries that changed, a base writes
them to RocksDB entry by entry, and the cache bounds how many stay decoded in memory.

>>> import tempfile
>>> from driftstream.snapshots.backend import RocksDBBackend
>>> from driftstream.snapshots.state_cache import StateCache
>>> entries = CachedEntries(StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db")))
>>> entries.fold([(("the", 7), [0, 4]), (("the", 9), [2]), (("the", 9), DELETED)])   # writes the watermark passed
>>> entries.get(("the", 7)), entries.get(("the", 9)), sorted(entries.entries("the"))
([0, 4], DELETED, [(7, [0, 4])])
>>> sorted(entries.cache.take_changes())            # a delta holds each changed entry
[('the', 7), ('the', 9)]
>>> entries.cache.close()

Costs: ``get`` O(1) (a cache miss: one RocksDB read), ``fold`` O(writes); ``entries``
O(records): for inspection and tests only.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator

from driftstream.ordering.entry_state import DELETED, SIZE

from .state_cache import StateCache


class CachedEntries:
    """The entry backend protocol of :class:`~driftstream.ordering.entry_state.EntryKeyedState`
    (see :class:`~driftstream.ordering.entry_state.DictEntryBackend`) over ``cache``.

    An entry's value is never None (``MapState.put`` refuses it): a missing record reads
    as :data:`~driftstream.ordering.entry_state.DELETED`.
    """

    def __init__(self, cache: StateCache) -> None:
        self.cache = cache

    def get(self, record: tuple) -> Any:
        value = self.cache.get(record)
        return DELETED if value is None else value

    def fold(self, writes: list) -> None:
        """Store ``writes`` (``((key, entry), value or DELETED)``, in order, of every key an advance
        folded): the entries' puts and deletes are the delta. One budget check for them all."""
        self.cache.put_many(writes, deleted=DELETED)

    def read_view(self) -> tuple:
        """What the in-order path in C reads instead of calling :meth:`get`: the cache's decoded
        states (never changed by the reader), its mark of a removed record, and the cache,
        whose ``complete`` says whether a record missing from them has no value (else: ``get``).

        >>> import tempfile
        >>> from driftstream.snapshots.backend import RocksDBBackend
        >>> entries = CachedEntries(StateCache(RocksDBBackend(tempfile.mkdtemp() + "/db")))
        >>> entries.fold([(("the", 7), [0, 4])]); states, removed, cache = entries.read_view()
        >>> states[("the", 7)], cache.complete
        ([0, 4], True)
        >>> entries.cache.close()
        """
        return (*self.cache.read_view(), self.cache)

    def entries(self, key: Hashable) -> Iterator[tuple]:
        return ((k[1], v) for k, v in self.cache.items() if type(k) is tuple and len(k) == 2 and k[0] == key and k[1] != SIZE)
