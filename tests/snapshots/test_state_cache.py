"""StateCache: states reach RocksDB only through snapshot writes; eviction never loses a change."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering.entry_state import DELETED
from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.changelog import REMOVED
from driftstream.snapshots.memory_size import MEASURE_EVERY, MEASURE_FIRST, RECORD_OVERHEAD, approx_size
from driftstream.snapshots.state_cache import StateCache, _mark_clean



def apply_op(cache: StateCache, op: tuple, taken: list, mark: Callable[[Any], None]) -> None:
    """One of the property tests' operations on ``cache``: a put, a fold, a removal, a base
    taken and written (kept in ``taken``), or, for anything else, the oldest base taken
    marked written by ``mark``."""
    if op[0] == "put":
        cache.put(op[1], op[2])
    elif op[0] == "fold":
        cache.put_many(op[1], deleted=DELETED)
    elif op[0] == "remove":
        cache.remove(op[1])
    elif op[0] == "remove_many":
        cache.remove_many(op[1])
    elif op[0] == "take":
        batch = cache.take_unwritten()
        cache.write(batch)
        taken.append(batch)
    elif taken:
        mark(taken.pop(0))


def written_base(cache: StateCache) -> dict:
    """A snapshot's base, written and acknowledged: the batch it wrote."""
    batch = cache.take_unwritten()
    cache.write(batch)
    cache.mark_written(batch)
    return batch

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


def test_a_removed_state_leaves_the_cache_once_its_deletion_is_written(tmp_path):
    # Every closed window removes its key: kept as a cached "removed" record, each one
    # stayed for the run's life (a sliding count over 1M events: 250k records).
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    for k in range(100):
        cache.put(k, k)
    cache.take_changes()
    written_base(cache)
    for k in range(45):
        cache.remove(k)
    cache.remove_many(range(45, 90))
    cache.put(95, -1)
    assert cache.stats()["records"] == 100  # not written yet: a delta still needs them
    assert set(cache.take_changes()) == set(range(90)) | {95}
    written_base(cache)
    assert cache.stats()["records"] == 10 and cache.complete
    assert [cache.get(k) for k in (0, 89, 90, 95)] == [None, None, 90, -1]
    assert cache.db.get(0) is None and cache.db.get(90) == 90
    cache.remove(90)
    batch = cache.take_unwritten()
    cache.put(90, 7)  # set again while its deletion is being written: it stays
    cache.write(batch)
    cache.mark_written(batch)
    assert cache.get(90) == 7 and cache.take_unwritten() == {90: 7}
    cache.close()


def test_eviction_drops_only_written_states(tmp_path):
    record = RECORD_OVERHEAD + approx_size(10)
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=3 * record)
    for k in range(5):
        cache.put(k, k * 10)  # all dirty and changed since the last snapshot: nothing may go
    assert all(cache.get(k) == k * 10 for k in range(5))
    cache.take_changes()
    written_base(cache)
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
    assert cache.spilled == 0 and cache.over_budget  # the owner holds processing back meanwhile
    cache.mark_written({})
    cache.fold(30, 1030, [30])  # over budget and nothing clean: dirty states spill
    assert cache.cached_bytes <= cache.budget and cache.spilled > 0 and not cache.over_budget
    changes = cache.take_changes()  # a delta reads the spilled ones back, with their inputs
    assert changes == {k: (1000 + k, [k]) for k in range(31)}
    assert [cache.get(k) for k in range(31)] == [1000 + k for k in range(31)]
    cache.remove(3)
    cache.put("filler", list(range(200)))  # spills the removal too
    assert cache.take_changes()[3][0] is REMOVED and cache.get(3) is None
    cache.close()


def test_the_change_record_stops_at_max_delta_keys_and_the_next_snapshot_is_a_base(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"), max_delta_keys=100)
    for k in range(100):
        cache.fold(k, k, [k])
    assert len(cache.take_changes()) == 100
    for k in range(1000):
        cache.fold(k, -k, [k])
    assert cache._changed is None  # not growing with the backlog
    assert cache.take_changes() is None
    assert written_base(cache) == {k: -k for k in range(1000)}  # the base holds every change
    cache.put("a", 1)
    assert cache.take_changes() == {"a": (1, None)}  # deltas again
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


def test_a_failed_write_does_not_put_back_a_state_older_than_the_key_s_newest(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.put("a", 1)
    cache.put("b", 1)
    batch = cache.take_unwritten()
    cache.put("a", 2)  # set again while the base was being written
    cache.unwritten_again(batch)
    assert cache.take_unwritten() == {"a": 2, "b": 1}
    cache.close()


# -- a miss without a RocksDB read: only while RocksDB holds nothing the cache has not seen --


class CountingBackend(RocksDBBackend):
    """Counts the reads that reach RocksDB."""

    reads = 0

    def get(self, key):
        self.reads += 1
        return super().get(key)


def test_a_fresh_cache_answers_a_miss_without_reading_rocksdb(tmp_path):
    db = CountingBackend(tmp_path / "db")
    cache = StateCache(db)
    assert cache.complete
    assert cache.get("new") is None and db.reads == 0
    cache.put("a", 1)
    written_base(cache)  # written and clean, still cached: still complete
    assert cache.complete and cache.get("a") == 1 and cache.get("other") is None and db.reads == 0
    cache.close()


def test_a_cache_over_a_restored_database_reads_every_miss(tmp_path):
    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    cache.put("a", 1)
    batch = cache.take_unwritten()
    cache.write(batch)
    ckpt = cache.checkpoint(tmp_path / "ckpt")
    cache.close()
    restored = StateCache(RocksDBBackend.restore(ckpt, tmp_path / "restored"))
    assert not restored.complete  # RocksDB holds a state the cache has not seen
    assert restored.get("a") == 1 and restored.get("b") is None
    restored.close()


def test_a_database_of_deletions_only_opens_complete(tmp_path):
    db = RocksDBBackend(tmp_path / "db")
    db.put("a", 1)
    db.put("a", REMOVED)  # a tombstone in RocksDB: no record
    assert StateCache(db).complete
    db.close()


def test_an_eviction_or_a_spill_ends_the_shortcut(tmp_path):
    record = RECORD_OVERHEAD + approx_size(10)
    evicting = StateCache(RocksDBBackend(tmp_path / "evict"), budget_bytes=3 * record)
    for k in range(3):
        evicting.put(k, k * 10)
    written_base(evicting)
    assert evicting.complete
    evicting.put(3, 30)
    assert evicting.evicted and not evicting.complete
    assert [evicting.get(k) for k in range(4)] == [0, 10, 20, 30]  # the evicted ones read back
    evicting.close()

    spilling = StateCache(RocksDBBackend(tmp_path / "spill"), budget_bytes=3 * record, track_changes=False)
    for k in range(5):
        spilling.put(k, k * 10)
    assert spilling.spilled and not spilling.complete
    assert [spilling.get(k) for k in range(5)] == [0, 10, 20, 30, 40]
    spilling.close()


_keys = st.integers(0, 11)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _keys, st.integers(0, 10**6)),
        st.tuples(st.just("remove"), _keys),
        st.tuples(st.just("remove_many"), st.lists(_keys, max_size=4)),  # a watermark's closed windows
        st.tuples(st.just("fold"), _keys, st.lists(st.integers(0, 9), min_size=1, max_size=3)),
        st.tuples(st.just("get"), _keys),
        st.tuples(st.just("delta")),
        st.tuples(st.just("base")),
        st.tuples(st.just("restart")),  # a base, then a new cache over the same database: a restore
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, records=st.integers(1, 8), preloaded=st.dictionaries(_keys, st.integers(0, 99), max_size=6))
def test_reads_agree_with_a_dict_under_eviction_spills_and_restores(tmp_path_factory, ops, records, preloaded):
    # A budget of a few records: evictions and spills all the time. ``preloaded``: states
    # RocksDB holds before the cache opens it (a restored instance). Every read must see
    # what a plain dict holds, whatever the cache dropped and whether it knew it was complete.
    path = tmp_path_factory.mktemp("db") / "db"
    db = RocksDBBackend(path)
    for k, v in preloaded.items():
        db.put(k, v)
    model = dict(preloaded)
    budget = records * (RECORD_OVERHEAD + approx_size(10**6))
    cache = StateCache(db, budget_bytes=budget)
    assert cache.complete == (not preloaded)
    for op in ops:
        if op[0] == "put":
            cache.put(op[1], op[2])
            model[op[1]] = op[2]
        elif op[0] == "remove":
            cache.remove(op[1])
            model.pop(op[1], None)
        elif op[0] == "remove_many":
            cache.remove_many(op[1])
            for k in op[1]:
                model.pop(k, None)
        elif op[0] == "fold":
            state = (model.get(op[1]) or 0) + sum(op[2])
            cache.fold(op[1], state, op[2])
            model[op[1]] = state
        elif op[0] == "get":
            assert cache.get(op[1]) == model.get(op[1])
        elif op[0] == "delta":  # each changed key's latest state, spilled or not
            assert all(state == model.get(k, REMOVED) for k, (state, _) in cache.take_changes().items())
        else:
            written_base(cache)
            if op[0] == "restart":
                cache.close()
                cache = StateCache(RocksDBBackend(path), budget_bytes=budget)
                assert cache.complete == (not model)
    assert {k: cache.get(k) for k in range(12)} == {k: model.get(k) for k in range(12)}
    cache.close()


def test_no_spill_until_every_base_taken_is_written(tmp_path):
    # In a backlog a base may be taken while the one before is still being written; the
    # end of the first must not let states spill before the second's checkpoint (it would
    # hold states later than its snapshot, and a restore would apply their inputs twice).
    record = RECORD_OVERHEAD + approx_size(1000)
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=10 * record)
    first = cache.take_unwritten()
    second = cache.take_unwritten()
    cache.write(first)
    cache.mark_written(first)
    for k in range(30):
        cache.fold(k, 1000 + k, [k])  # over budget, nothing clean
    assert cache.spilled == 0
    cache.write(second)
    cache.mark_written(second)
    cache.fold(30, 1030, [30])
    assert cache.spilled > 0 and cache.cached_bytes <= cache.budget
def test_over_budget_while_a_base_is_pending_a_put_does_not_walk_the_dropped_slots(tmp_path):
    """Nothing may go while a base is pending and nothing is clean: _evict returns at once
    (it walked every slot the clean dict had dropped, on every put); the clean dict is
    compacted once it has dropped more keys than it holds."""
    record = RECORD_OVERHEAD + approx_size(10)
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=50 * record)
    for k in range(200):
        cache.put(k, k)
    cache.take_changes()
    batch = cache.take_unwritten()
    cache.write(batch)
    cache.mark_written(batch)  # 200 clean states over a budget of 50: most dropped at once
    assert len(cache._clean) <= 50 and cache._clean._dropped <= len(cache._clean)  # compacted
    pending = cache.take_unwritten()  # a base of nothing, pending: no spill
    spilled = cache.spilled
    for k in range(1000, 1100):
        cache.put(k, k)
    assert not cache._clean and cache.cached_bytes > cache.budget and cache.spilled == spilled

    class Walked(dict):
        def items(self):
            raise AssertionError("walked an empty clean dict")

    cache._clean.sizes = Walked()
    cache.put(2000, 1)  # returns before the walk
    cache._clean.sizes = {}
    cache.write(pending)
    cache.mark_written(pending)
    cache.put(2001, 1)  # the base is done: dirty states spill down to the low-water mark
    assert cache.spilled > spilled and cache.cached_bytes <= cache.budget
    assert all(cache.get(k) == k for k in range(1000, 1100))
    cache.close()


def test_dirty_states_count_at_a_measured_size_before_any_is_written(tmp_path):
    """Before the first base writes (and measures) any state, dirty states counted at
    RECORD_OVERHEAD alone; the first MEASURE_FIRST are measured as they are set."""

    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    big = list(range(100))
    for k in range(MEASURE_FIRST * 2):
        cache.put(k, big)
    assert cache.cached_bytes == MEASURE_FIRST * 2 * (RECORD_OVERHEAD + approx_size(big))
    assert cache._sizes.count == MEASURE_FIRST
    cache.close()


def test_a_base_measures_a_sample_and_every_long_container(tmp_path):
    """Past MEASURE_FIRST a base measures one written state in MEASURE_EVERY; a container longer
    than approx_size's sample is always measured, so a large state off the stride does not
    count at the mean of small ones once clean."""

    cache = StateCache(RocksDBBackend(tmp_path / "db"))
    for k in range(MEASURE_FIRST):
        cache.put(k, [k])
    written_base(cache)
    small = RECORD_OVERHEAD + approx_size([0])
    assert cache.cached_bytes == MEASURE_FIRST * small
    big = list(range(10_000))
    keys = [("w", i) for i in range(MEASURE_EVERY * 4)]
    for key in keys:
        cache.put(key, big if key == keys[3] else [1])  # off the stride (index 3 of each chunk)
    measured = cache._sizes.count
    written_base(cache)
    assert cache._sizes.count == measured + 4 + 1  # every MEASURE_EVERY-th state, and the big one
    assert cache.cached_bytes >= (MEASURE_FIRST + len(keys) - 1) * small + RECORD_OVERHEAD + approx_size(big)
    cache.close()


_mark_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _keys, st.integers(0, 10**6)),
        st.tuples(st.just("remove"), _keys),
        st.tuples(st.just("remove_many"), st.lists(_keys, max_size=4)),  # a watermark's closed windows
        st.tuples(st.just("fold"), st.lists(st.tuples(_keys, st.one_of(st.integers(0, 10**6), st.just(DELETED))), max_size=4)),
        st.tuples(st.just("take")),  # a base taken and written, marked later: keys may change meanwhile
        st.tuples(st.just("mark")),
    ),
    max_size=60,
)


@pytest.mark.skipif(_mark_clean is None, reason="snapshots._written is not built (test_the_accelerator_is_built says why)")
@settings(max_examples=150, deadline=None)
@given(ops=_mark_ops, records=st.integers(1, 8), stop_measuring=st.booleans())
def test_the_caches_loops_in_c_do_what_the_python_does(tmp_path_factory, ops, records, stop_measuring):
    budget = records * (RECORD_OVERHEAD + approx_size(10**6))
    caches = [StateCache(RocksDBBackend(tmp_path_factory.mktemp("db") / "db"), budget_bytes=budget) for _ in range(2)]
    caches[1].native = False  # the reference
    for cache in caches:
        if stop_measuring:
            # past the states measured one by one: put_many's loop runs in C too
            cache._sizes.count, cache._sizes.total = MEASURE_FIRST, MEASURE_FIRST * (RECORD_OVERHEAD + approx_size(10**6))
    pending: list = [[], []]
    for op in ops:
        for cache, taken in zip(caches, pending):
            apply_op(cache, op, taken, cache.mark_written)
        fast, reference = caches
        assert list(fast._clean.sizes.items()) == list(reference._clean.sizes.items())
        assert fast._states == reference._states and fast._clean.bytes == reference._clean.bytes
        assert fast.evicted == reference.evicted and fast.spilled == reference.spilled
        assert fast._unwritten == reference._unwritten and fast._changed == reference._changed
    for cache in caches:
        cache.close()


# -- a base's marks wait while the cache is far below its budget ------------------------------


def base_as_a_snapshot_writes_it(cache: StateCache) -> int:
    """A base the way StageSnapshots writes it: its rows, then the marks :meth:`written` says are
    due (none while they wait). Returns the rows marked."""
    batch = cache.take_unwritten()
    cache.write(batch)
    marked = 0
    for due, sizes in cache.written(batch):
        cache.mark_items_written(list(due.items()), sizes)
        marked += len(due)
    cache.end_write()
    return marked


def test_a_bases_marks_wait_below_the_budgets_low_water_and_are_all_made_past_it(tmp_path):
    row = RECORD_OVERHEAD + approx_size([0])
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=400 * row)  # low water: 360 rows
    for base in range(3):
        for i in range(50):
            cache.put((base, i), [i])
        assert base_as_a_snapshot_writes_it(cache) == 0  # 50..150 rows cached and as many waiting: under 360
    assert len(cache._clean) == 0 and cache._deferred_rows == 150
    for i in range(50):
        cache.put((3, i), [i])
    assert base_as_a_snapshot_writes_it(cache) == 200  # 200 and 200: every written base's rows, in order
    assert len(cache._clean) == 200 and not cache._deferred
    assert list(cache._clean.sizes)[:2] == [(0, 0), (0, 1)]  # the oldest first: dropped first
    cache.close()


def test_a_cache_over_budget_marks_the_waiting_rows_before_it_drops_and_loses_none(tmp_path):
    # marks waited (budget far away), then the budget shrinks below what the cache holds: the
    # next put marks them and evicts clean states, which read back from RocksDB
    row = RECORD_OVERHEAD + approx_size([0])
    cache = StateCache(RocksDBBackend(tmp_path / "db"), budget_bytes=10_000 * row)
    for i in range(300):
        cache.put(("w", i), [i])
    cache.remove(("w", 0))
    assert base_as_a_snapshot_writes_it(cache) == 0 and ("w", 0) in cache._states  # a removed state stays until marked
    cache.budget = 100 * row
    cache.put(("w", 1), [-1])
    assert not cache._deferred and cache.evicted and cache.cached_bytes <= cache.budget
    assert ("w", 0) not in cache._states  # its deletion written and marked: gone from the cache
    assert [cache.get(("w", i)) for i in range(300)] == [None, [-1]] + [[i] for i in range(2, 300)]
    cache.close()


@settings(max_examples=100, deadline=None)
@given(ops=_mark_ops, records=st.integers(1, 30))
def test_a_cache_whose_marks_wait_holds_what_one_marking_at_once_holds(tmp_path_factory, ops, records):
    # the same operations on two caches, one marking every base at once (mark_written), one
    # as a snapshot does (written: marks wait below the budget's low water): the same states read back,
    # in both RocksDB and the cache, and the budget kept once no base is pending
    budget = records * (RECORD_OVERHEAD + approx_size(10**6))
    caches = [StateCache(RocksDBBackend(tmp_path_factory.mktemp("db") / "db"), budget_bytes=budget) for _ in range(2)]
    pending: list = [[], []]

    def waiting_marks(cache: StateCache) -> Callable:
        def mark(batch: Any) -> None:
            for due, sizes in cache.written(batch):
                cache.mark_items_written(due.items(), sizes)
            cache.end_write()
        return mark

    for op in ops:
        for n, (cache, taken) in enumerate(zip(caches, pending)):
            apply_op(cache, op, taken, cache.mark_written if n == 0 else waiting_marks(cache))
        eager, waiting = caches
        for key in range(12):  # every key _keys makes
            assert waiting.get(key) == eager.get(key)
        if not waiting._bases_pending:
            assert waiting.cached_bytes <= waiting.budget or not (waiting._clean or waiting._unwritten)
    for cache in caches:
        cache.close()
