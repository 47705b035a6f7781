"""StateCache: states reach RocksDB only through snapshot writes; eviction never loses a change."""

from __future__ import annotations

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.changelog import REMOVED
from driftstream.snapshots.memory_size import approx_size
from driftstream.snapshots.state_cache import RECORD_OVERHEAD, StateCache


def test_puts_reach_rocksdb_only_when_written(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.put("a", {1: [0, 2]})
    cache.put("b", 2)
    assert cache.db.get("a") is None
    batch = cache.take_unwritten()
    assert batch == {"a": {1: [0, 2]}, "b": 2}
    assert cache.take_unwritten() == {}
    cache.put("b", 3)  # changed after the batch was taken: the batch keeps the old value
    cache.write(batch)
    cache.mark_written(batch)
    assert cache.db.get("a") == {1: [0, 2]} and cache.db.get("b") == 2
    assert cache.get("b") == 3
    assert cache.take_unwritten() == {"b": 3}
    cache.close()


def test_eviction_drops_only_written_states(tmp_path):
    record = RECORD_OVERHEAD + approx_size(10)
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=3 * record)
    for k in range(5):
        cache.put(k, k * 10)  # all dirty and changed since the last snapshot: nothing may go
    assert all(cache.get(k) == k * 10 for k in range(5))
    cache.take_changes()
    batch = cache.take_unwritten()
    cache.write(batch)
    cache.mark_written(batch)
    cache.take_changes()
    cache.put(99, 990)  # over budget with clean states: the oldest are evicted
    assert cache.cached_bytes <= cache.budget and cache.evicted >= 3
    assert [cache.get(k) for k in range(5)] == [0, 10, 20, 30, 40]  # read back from RocksDB
    assert cache.get(99) == 990 and cache.read_back >= 3
    cache.close()


def test_dirty_states_spill_to_rocksdb_but_not_while_a_base_is_written(tmp_path):
    record = RECORD_OVERHEAD + approx_size(1000)
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=10 * record)
    cache.take_unwritten()  # a base in flight: its checkpoint must not see later states
    for k in range(30):
        cache.fold(k, 1000 + k, [k])
    assert cache.spilled == 0
    cache.mark_written({})
    cache.fold(30, 1030, [30])  # over budget and nothing clean: dirty states spill
    assert cache.cached_bytes <= cache.budget and cache.spilled > 0
    changes = cache.take_changes()  # a delta reads the spilled ones back, with their inputs
    assert changes == {k: (1000 + k, [k]) for k in range(31)}
    assert [cache.get(k) for k in range(31)] == [1000 + k for k in range(31)]
    cache.remove(3)
    cache.put("filler", list(range(200)))  # spills the removal too
    assert cache.take_changes()[3][0] is REMOVED and cache.get(3) is None
    cache.close()


def test_without_snapshots_memory_stays_within_the_budget(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=64 << 10, track_changes=False)
    for k in range(20_000):
        cache.put(("word", k), [k, k + 1, k + 2])
        if k % 7 == 0:
            cache.remove(("word", k - 1))
    assert cache.cached_bytes <= cache.budget and cache.stats()["records"] < 20_000
    assert cache.get(("word", 5)) == [5, 6, 7] and cache.get(("word", 6)) is None
    assert cache.get(("word", 19_999)) == [19_999, 20_000, 20_001]
    cache.close()


def test_a_checkpoint_holds_what_was_written(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.put("k", "v1")
    batch = cache.take_unwritten()
    cache.write(batch)
    cache.put("k", "v2")  # not yet written: not in the checkpoint
    ckpt = cache.checkpoint(tmp_path / "ckpt")
    cache.close()
    restored = StateCache(RocksDBBackend.restore(ckpt, tmp_path / "restored"))
    assert restored.get("k") == "v1" and restored.get("missing") is None
    assert dict(restored.items()) == {"k": "v1"}
    restored.close()


def test_changes_carry_the_folded_inputs_until_a_put_makes_them_unknown(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.fold("a", 3, [1, 2])
    cache.fold("a", 6, [3])
    cache.fold("b", "x", ["x"])
    cache.put("b", "y")  # a state set without its inputs: the delta must hold the state
    cache.fold("b", "yz", ["z"])
    assert cache.take_changes() == {"a": (6, [1, 2, 3]), "b": ("yz", None)}
    assert cache.take_changes() == {}
    assert cache.take_unwritten() == {"a": 6, "b": "yz"}  # the base write is tracked apart
    cache.close()


def test_a_failed_write_puts_its_keys_back_for_the_next_base(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.put("a", 1)
    batch = cache.take_unwritten()
    cache.unwritten_again(batch)
    assert cache.take_unwritten() == {"a": 1}
    cache.close()
