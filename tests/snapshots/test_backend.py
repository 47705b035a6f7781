"""RocksDBBackend on real RocksDB files: the DictBackend protocol, checkpoints that
hold exactly the states at checkpoint time, restores that leave the checkpoint
untouched, and nothing pickled on disk."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from rocksdict import DbClosedError, Options, Rdict

from driftstream.ordering.keyed_state import DictBackend, DriftingKeyedState
from driftstream.ordering.meta import TOP, Meta
from driftstream.snapshots.backend import RocksDBBackend
from driftstream.ordering.key_groups import KeyGroups
from driftstream.snapshots.changelog import REMOVED
from driftstream.snapshots.codec import decode
from driftstream.snapshots.state_keys import PREFIX_BYTES, StateKeys


@pytest.fixture
def backend(tmp_path):
    b = RocksDBBackend(tmp_path / "db")
    yield b
    b.close()


def _random_states(n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    keys = [f"word{i}" for i in range(n // 2)] + [(i, "t") for i in range(n // 4)]
    keys += range(10**6, 10**6 + n - len(keys))

    def state():
        return rng.choice([rng.randrange(10**9), [rng.random() for _ in range(3)], {"n": rng.randrange(9), "s": {1, 2}}, None, "x" * 9])

    return {k: state() for k in keys}


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# -- the backend protocol ---------------------------------------------------------------


def test_get_put_items_like_a_dict_backend(backend):
    ref = DictBackend()
    assert backend.get("missing") is None
    for key, state in [("a", 1), ("b", [1, 2]), (("t", 1), {"x": (1, 2)}), (7, None), (b"raw", {3, 4}), (None, "none key"), ("a", 2)]:
        backend.put(key, state)
        ref.put(key, state)
    for key, state in ref.items():
        assert backend.get(key) == state
    assert dict(backend.items()) == dict(ref.items())
    assert backend.get("missing") is None


def test_equal_keys_are_one_row_as_in_a_dict(backend):
    backend.put(1, "int")
    backend.put(1.0, "float")
    assert backend.get(True) == "float"
    assert list(backend.items()) == [(1, "float")]


def test_states_survive_close_and_reopen(tmp_path):
    with RocksDBBackend(tmp_path / "db") as b:
        b.put("k", {"n": [1, 2, 3]})
    with RocksDBBackend(tmp_path / "db") as b:
        assert b.get("k") == {"n": [1, 2, 3]}


def test_unencodable_states_and_keys_are_refused_not_pickled(backend):
    with pytest.raises(TypeError, match="type object"):
        backend.put("k", object())
    with pytest.raises(TypeError, match="no stable hash"):  # its key group: it could not have been routed either
        backend.put(["list", "key"], 1)
    assert list(backend.items()) == []


def test_on_disk_rows_are_codec_bytes(tmp_path):
    with RocksDBBackend(tmp_path / "db") as b:
        b.put(("k", 1), {"s": {1, 2}})
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))  # read the files without the backend
    try:
        [(k, v)] = list(db.items())
    finally:
        db.close()
    assert StateKeys.group(k) == KeyGroups().group_of(("k", 1)) and decode(k[PREFIX_BYTES:]) == ("k", 1) and decode(v) == {"s": {1, 2}}
    assert not v.startswith(b"\x80")  # no pickle protocol header


def test_close_is_idempotent_and_later_use_fails(tmp_path):
    b = RocksDBBackend(tmp_path / "db")
    b.close()
    b.close()
    with pytest.raises(DbClosedError):
        b.get("k")


# -- checkpoint and restore ----------------------------------------------------------------


def test_checkpoint_then_restore_gives_the_same_states(backend, tmp_path):
    states = _random_states(3000)
    for k, v in states.items():
        backend.put(k, v)  # everything still in the memtable: the checkpoint must flush it
    cp = backend.checkpoint(tmp_path / "cp")
    assert (cp / "CURRENT").is_file()
    with RocksDBBackend.restore(cp, tmp_path / "restored") as r:
        assert dict(r.items()) == states
        assert r.get("word7") == states["word7"]


def test_writes_after_a_checkpoint_do_not_leak_into_it(backend, tmp_path):
    for i in range(100):
        backend.put(i, f"v{i}")
    cp = backend.checkpoint(tmp_path / "cp")
    for i in range(50, 150):
        backend.put(i, f"late{i}")  # overwrite half, add 50 new
    backend.put(0, None)
    with RocksDBBackend.restore(cp, tmp_path / "restored") as r:
        assert dict(r.items()) == {i: f"v{i}" for i in range(100)}
    assert backend.get(120) == "late120" and backend.get(0) is None


def test_successive_checkpoints_are_independent(backend, tmp_path):
    backend.put("k", 1)
    cp1 = backend.checkpoint(tmp_path / "cps" / "1")  # parent created on demand
    backend.put("k", 2)
    cp2 = backend.checkpoint(tmp_path / "cps" / "2")
    with RocksDBBackend.restore(cp1, tmp_path / "r1") as r1, RocksDBBackend.restore(cp2, tmp_path / "r2") as r2:
        assert (r1.get("k"), r2.get("k")) == (1, 2)


def test_a_flush_started_beforehand_leaves_the_checkpoint_nothing_to_flush(backend, tmp_path):
    for i in range(2000):
        backend.put(i, [i] * 10)
    assert backend._db.property_int_value("rocksdb.num-entries-active-mem-table") == 2000
    backend.start_flush()
    deadline = time.time() + 30
    while backend.flushing() and time.time() < deadline:
        time.sleep(0.002)
    assert not backend.flushing()
    assert backend._db.property_int_value("rocksdb.num-entries-active-mem-table") == 0
    restored = RocksDBBackend.restore(backend.checkpoint(tmp_path / "cp"), tmp_path / "r")
    assert dict(restored.items()) == {i: [i] * 10 for i in range(2000)}
    restored.close()


def test_checkpoint_table_files_are_hard_links(backend, tmp_path):
    for i in range(1000):
        backend.put(i, i)
    cp = backend.checkpoint(tmp_path / "cp")
    ssts = list(cp.glob("*.sst"))
    assert ssts and all(p.stat().st_nlink >= 2 for p in ssts)


def test_restore_leaves_the_checkpoint_untouched_and_restores_are_independent(backend, tmp_path):
    backend.put("k", "v")
    cp = backend.checkpoint(tmp_path / "cp")
    before = _files(cp)
    r1 = RocksDBBackend.restore(cp, tmp_path / "r1")
    r2 = RocksDBBackend.restore(cp, tmp_path / "r2")
    r1.put("k", "changed in r1")
    r1.put("new", 1)
    assert r2.get("k") == "v" and r2.get("new") is None
    r1.close()
    r2.close()
    assert _files(cp) == before


def test_checkpoint_and_restore_refuse_existing_targets(backend, tmp_path):
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError):
        backend.checkpoint(tmp_path / "exists")
    cp = backend.checkpoint(tmp_path / "cp")
    with pytest.raises(FileExistsError):
        RocksDBBackend.restore(cp, tmp_path / "exists")
    with pytest.raises(FileNotFoundError, match="not a RocksDB checkpoint"):
        RocksDBBackend.restore(tmp_path / "exists", tmp_path / "r")


# -- as the backend of keyed state -------------------------------------------------------------


def _concat(state, x):
    new = (state or "") + x
    return new, new


def test_drifting_keyed_state_on_rocksdb_matches_the_dict_backend(tmp_path):
    rng = random.Random(3)
    elements = [(Meta(t, 0, 0, t), rng.choice("abc"), f"k{rng.randrange(20)}") for t in range(400)]
    shuffled = elements[:]
    rng.shuffle(shuffled)
    on_dict = DriftingKeyedState(_concat)
    with RocksDBBackend(tmp_path / "db") as rdb:
        on_rocks = DriftingKeyedState(_concat, backend=rdb)
        for start in range(0, 400, 50):  # watermarks in between fold into the backend mid-stream
            batch = shuffled[start : start + 50]
            assert on_rocks.apply_batch(batch) == on_dict.apply_batch(batch)
            wm = (min(m for m, _, _ in shuffled[start + 50 :]).time) if start + 50 < 400 else TOP
            on_rocks.advance(wm)
            on_dict.advance(wm)
        assert dict(rdb.items()) == dict(on_dict.backend.items())
        cp = rdb.checkpoint(tmp_path / "cp")
    with RocksDBBackend.restore(cp, tmp_path / "restored") as r:
        assert dict(r.items()) == dict(on_dict.backend.items())


# -- bulk mode: a vector memtable until the first point read ------------------------------------


def test_a_bulk_database_holds_its_writes_in_checkpoints_and_the_first_read_ends_the_mode(tmp_path):
    # a fresh instance's database (StageSnapshots opens it bulk): bases write, checkpoints
    # link, nothing reads; then a cache miss reads, and the database goes on as before
    states = _random_states(3000, seed=5)
    items = list(states.items())
    b = RocksDBBackend(tmp_path / "db", bulk=True)
    b.put_many(items[:2000])
    b.put(items[0][0], "changed")
    b.put_many([(items[1][0], REMOVED)])
    b.start_flush()
    deadline = time.monotonic() + 10
    while b.flushing() and time.monotonic() < deadline:
        time.sleep(0.005)
    cp = b.checkpoint(tmp_path / "cp1")
    b.put_many(items[2000:])  # after the checkpoint: in the memtable, out of the checkpoint
    expected = dict(items[:2000]) | {items[0][0]: "changed"}
    del expected[items[1][0]]
    restored = RocksDBBackend.restore(cp, tmp_path / "r1")
    assert dict(restored.items()) == expected
    restored.close()
    assert b.bulk and dict(b.items()) == expected | dict(items[2000:])  # an iterator reads the vector memtable too
    assert b.get(items[2500][0]) == items[2500][1] and not b.bulk  # a point read ends bulk: nothing lost
    assert b.get(items[1][0]) is None and b.get(items[0][0]) == "changed"
    b.put(items[3][0], "later")
    cp2 = b.checkpoint(tmp_path / "cp2")
    restored = RocksDBBackend.restore(cp2, tmp_path / "r2")
    assert dict(restored.items()) == expected | dict(items[2000:]) | {items[3][0]: "later"}
    restored.close()
    b.close()


def test_a_cache_over_a_bulk_database_ends_the_mode_at_its_first_drop_and_reads_back_what_it_dropped(tmp_path):
    # a drop makes the cache incomplete: misses read RocksDB from then on, so the bulk mode
    # ends there (between writes), before any read
    from driftstream.snapshots.memory_size import RECORD_OVERHEAD
    from driftstream.snapshots.state_cache import StateCache

    cache = StateCache(RocksDBBackend(tmp_path / "db", bulk=True), budget_bytes=50 * (RECORD_OVERHEAD + 100), track_changes=False)
    assert cache.complete and cache.db.bulk
    for i in range(10):
        cache.put(("w", i), [i] * 5)
    assert cache.complete and cache.db.bulk and not cache.spilled
    for i in range(10, 400):
        cache.put(("w", i), [i] * 5)
    assert cache.spilled and not cache.complete and not cache.db.bulk
    assert [cache.get(("w", i)) for i in range(400)] == [[i] * 5 for i in range(400)]
    assert cache.read_back
    cache.close()
