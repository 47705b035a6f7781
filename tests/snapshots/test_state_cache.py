"""StateCache: states reach RocksDB only through snapshot writes; eviction never loses a change."""

from __future__ import annotations

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.state_cache import StateCache


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
    cache = StateCache(RocksDBBackend(tmp_path / "db"), capacity=3)
    for k in range(5):
        cache.put(k, k * 10)  # all dirty: nothing may be evicted
    assert all(cache.get(k) == k * 10 for k in range(5))
    batch = cache.take_unwritten()
    cache.write(batch)
    cache.mark_written(batch)
    cache.put(99, 990)  # over capacity with clean states: the oldest are evicted
    assert len(cache._states) <= 3
    assert [cache.get(k) for k in range(5)] == [0, 10, 20, 30, 40]  # read back from RocksDB
    assert cache.get(99) == 990
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
