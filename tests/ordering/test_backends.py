"""The state backend protocols: every backend the engine hands a keyed or an entry state
has the methods the state calls (a typing.Protocol, checked here at run time too)."""

from __future__ import annotations

from driftstream.ordering.entry_state import DictEntryBackend, EntryBackend
from driftstream.ordering.keyed_state import DictBackend, StateBackend
from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.entry_cache import CachedEntries
from driftstream.snapshots.state_cache import StateCache


def test_the_dict_and_rocksdb_backends_meet_the_protocols(tmp_path):
    cache = StateCache(RocksDBBackend(str(tmp_path / "db")))
    try:
        assert isinstance(DictBackend(), StateBackend) and isinstance(cache, StateBackend)
        assert isinstance(DictEntryBackend(), EntryBackend) and isinstance(CachedEntries(cache), EntryBackend)
        assert not isinstance(DictEntryBackend(), StateBackend)  # an entry backend is not a state backend
    finally:
        cache.close()
