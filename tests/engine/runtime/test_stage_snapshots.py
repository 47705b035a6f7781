"""StageSnapshots: a base checkpoint then deltas; restoring any snapshot gives back exactly
the states it was taken with (real RocksDB files and a local snapshot store)."""

from __future__ import annotations

import asyncio

from driftstream.engine.model.manifest import SnapshotPart
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.snapshots.changelog import DELTA_FILE


def _take(snaps: StageSnapshots, snapshot_id: int) -> dict:
    async def go() -> dict:
        done = asyncio.get_running_loop().create_future()
        snaps.take(snapshot_id, (0,), None, done.set_result)
        return await done

    return asyncio.run(go())


def _states(snaps: StageSnapshots, step: str) -> dict:
    return dict(snaps.backends[step].items())


def append(state, x):
    """An order-sensitive step function: the state is the sequence of inputs."""
    return (state or ()) + (x,), None


def test_restoring_a_base_plus_deltas_gives_the_states_of_that_snapshot(tmp_path):
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "flow-stage-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    history = [
        {"a": 1, "b": [1, 2]},
        {"a": 2},
        {},  # nothing changed
        {"b": [3], "c": {"x": (1, 2)}},
    ]
    expected, entries = {}, []
    for snapshot_id, changes in enumerate(history, start=1):
        for k, v in changes.items():
            cache.put(k, v)
        expected[snapshot_id] = {**(expected.get(snapshot_id - 1) or {}), **changes}
        entries.append(_take(snaps, snapshot_id).states["count"])
    snaps.close()

    assert entries[0] == {"participant": "flow-stage-0-count", "base": 1, "deltas": []}
    assert entries[1]["deltas"] == [2] and entries[2]["deltas"] == [2]  # no delta without changes
    assert entries[3] == {"participant": "flow-stage-0-count", "base": 1, "deltas": [2, 4]}
    for snapshot_id, entry in enumerate(entries, start=1):
        restored = StageSnapshots(store, "flow-stage-0", SnapshotPart(states={"count": entry}))
        restored.backend("count", append)
        assert _states(restored, "count") == expected[snapshot_id], snapshot_id
        restored.close()


def test_more_changed_keys_than_a_delta_holds_make_the_snapshot_a_base(tmp_path):
    """Past ``max_delta_keys`` changed keys a delta would cost what a base does and the base
    would still follow: the snapshot writes the base (and the change record stops growing)."""
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "flow-stage-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    cache.max_delta_keys = 3
    entries = []
    for snapshot_id, keys in enumerate(["a", "bc", "defg", "h"], start=1):
        for k in keys:
            cache.fold(k, append(None, k)[0], [k])
        entries.append(_take(snaps, snapshot_id).states["count"])
    snaps.close()

    assert [(e["base"], e["deltas"]) for e in entries] == [(1, []), (1, [2]), (3, []), (3, [4])]
    restored = StageSnapshots(store, "flow-stage-0", SnapshotPart(states={"count": entries[-1]}))
    restored.backend("count", append)
    assert _states(restored, "count") == {k: (k,) for k in "abcdefgh"}
    restored.close()


def test_a_restored_chain_goes_on_and_a_new_base_comes_after_base_every_s(tmp_path):
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "f-s-0", None, base_every_s=3600)
    snaps.backend("count", append).put("a", 1)
    _take(snaps, 1)
    snaps.backends["count"].put("a", 2)
    entry = _take(snaps, 2).states["count"]
    snaps.close()
    assert entry["deltas"] == [2]

    resumed = StageSnapshots(store, "f-s-0", SnapshotPart(states={"count": entry}), base_every_s=0.0)
    resumed.backend("count", append).put("b", 3)
    entry = _take(resumed, 3).states["count"]
    resumed.close()
    assert entry == {"participant": "f-s-0-count", "base": 3, "deltas": []}  # base_every_s=0: always a base
    again = StageSnapshots(store, "f-s-0", SnapshotPart(states={"count": entry}))
    again.backend("count", append)
    assert _states(again, "count") == {"a": 2, "b": 3}
    again.close()


def test_a_delta_is_one_file_of_the_changed_states(tmp_path):
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    cache.put("a", list(range(1000)))
    _take(snaps, 1)
    cache.put("b", 1)
    _take(snaps, 2)
    snaps.close()
    from driftstream.snapshots.changelog import decode_delta
    from driftstream.snapshots.store import SnapshotStore

    rows = decode_delta(SnapshotStore(store).get_file(2, "f-s-0-count", DELTA_FILE))
    assert len(rows) == 1  # "a" did not change: it is only in the base


def test_deltas_of_folded_inputs_are_re_applied_on_restore(tmp_path):
    """A hot key's delta holds the inputs folded since the last snapshot, not its whole state."""
    from driftstream.snapshots.changelog import decode_delta
    from driftstream.snapshots.store import SnapshotStore

    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    state = None
    entries, expected = [], []
    for snapshot_id, inputs in enumerate([list(range(500)), [500], [501, 502], []], start=1):
        for x in inputs:
            state = append(state, x)[0]
        if inputs:
            cache.fold("hot", state, inputs)
        entries.append(_take(snaps, snapshot_id).states["count"])
        expected.append(state)
    snaps.close()
    rows = decode_delta(SnapshotStore(store).get_file(3, "f-s-0-count", DELTA_FILE))
    assert [kind for _, kind, _ in rows] == ["inputs"] and len(rows[0][2]) < 10  # two small ints, not 503
    for entry, state in zip(entries, expected):
        restored = StageSnapshots(store, "f-s-0", SnapshotPart(states={"count": entry}))
        assert restored.backend("count", append).get("hot") == state
        restored.close()


def test_a_failed_delta_makes_the_next_snapshot_a_base(tmp_path, monkeypatch):
    """Without the failed delta the chain would miss its changes: nothing may build on it."""
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    cache.fold("k", (1,), [1])
    _take(snaps, 1)
    real_put_file = snaps.store.put_file
    monkeypatch.setattr(snaps.store, "put_file", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    cache.fold("k", (1, 2), [2])
    assert "disk full" in _take(snaps, 2).error
    monkeypatch.setattr(snaps.store, "put_file", real_put_file)
    cache.fold("k", (1, 2, 3), [3])
    entry = _take(snaps, 3).states["count"]
    snaps.close()
    assert entry["base"] == 3 and entry["deltas"] == []
    restored = StageSnapshots(store, "f-s-0", SnapshotPart(states={"count": entry}))
    assert restored.backend("count", append).get("k") == (1, 2, 3)
    restored.close()


def test_only_workdirs_of_gone_processes_are_removed(tmp_path, monkeypatch):
    import os
    import tempfile

    from driftstream.engine.runtime.stage_snapshots import _remove_stale_workdirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tempfile.mkdtemp(prefix="driftstream-f-s-1-999999999-")  # no such process
    live = tempfile.mkdtemp(prefix=f"driftstream-f-s-1-{os.getppid()}-")  # another live incarnation
    other = tempfile.mkdtemp(prefix="driftstream-f-s-12-999999999-")  # instance 12, not 1
    _remove_stale_workdirs(str(tmp_path), "f-s-1")
    assert not os.path.exists(dead) and os.path.exists(live) and os.path.exists(other)


def test_large_deltas_and_bases_are_written_in_slices_between_other_callbacks(tmp_path, monkeypatch):
    """Past INLINE_DELTA_KEYS a delta (and any base) is written by a task that gives the event
    loop a turn every SLICE_S; in order, and restoring gives the same states."""
    import driftstream.engine.runtime.stage_snapshots as stage_snapshots

    monkeypatch.setattr(stage_snapshots, "SLICE_S", 0.0)  # a turn after every key
    store = str(tmp_path / "store")
    snaps = StageSnapshots(store, "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    keys = range(stage_snapshots.INLINE_DELTA_KEYS + 1)

    async def go() -> list:
        turns = [0]

        def other_callback() -> None:  # stands for the loop's processing of elements
            turns[0] += 1
            loop.call_soon(other_callback)

        loop = asyncio.get_running_loop()
        loop.call_soon(other_callback)
        answers = []
        for snapshot_id in (1, 2, 3):  # a base, a one-key delta (queued behind it), a large delta
            if snapshot_id == 2:
                cache.fold("small", ("small",), ["small"])
            if snapshot_id == 3:
                for k in keys:
                    cache.fold(k, (k,), [k])
            done = loop.create_future()
            snaps.take(snapshot_id, (0,), None, lambda part, done=done: done.set_result((turns[0], part)))
            answers.append(done)
        return [await a for a in answers]

    (_, base), (_, small), (turns, large) = asyncio.run(go())
    assert base.states["count"] == {"participant": "f-s-0-count", "base": 1, "deltas": []}
    assert small.states["count"]["deltas"] == [2] and large.states["count"]["deltas"] == [2, 3]
    assert turns >= len(keys)  # the loop had a turn between the large delta's keys
    snaps.close()
    restored = StageSnapshots(store, "f-s-0", SnapshotPart(states={"count": large.states["count"]}))
    restored.backend("count", append)
    assert _states(restored, "count") == {"small": ("small",), **{k: (k,) for k in keys}}
    restored.close()


def test_a_base_marks_its_rows_clean_in_slices_and_a_row_changed_meanwhile_stays_dirty(tmp_path, monkeypatch):
    """Marking a base's rows clean is O(rows) (~12 ms for 12k): it goes in slices with other
    callbacks in between; a row changed in between is not marked clean (the base wrote its
    older state), so the next base writes it again."""
    import driftstream.engine.runtime.stage_snapshots as stage_snapshots
    import driftstream.snapshots.state_cache as state_cache

    monkeypatch.setattr(stage_snapshots, "SLICE_S", 0.0)  # a turn after every chunk of rows,
    monkeypatch.setattr(stage_snapshots, "WRITE_CHUNK", 1)  # of one row
    monkeypatch.setattr(state_cache, "DEFER_MARKS_BELOW", 0.0)  # marked at once, not when the cache fills
    snaps = StageSnapshots(str(tmp_path / "store"), "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    keys = list(range(40))
    for k in keys:
        cache.fold(k, (k,), [k])

    async def go() -> list:
        seen = []

        def other_callback() -> None:  # the loop's processing of elements, between slices
            clean = len(cache._clean)
            seen.append(clean)
            if 0 < clean < len(keys) and "late" not in cache._states:
                unmarked = [k for k in keys if k not in cache._clean]
                cache.fold(unmarked[-1], ("changed",), ["changed"])
                cache.fold("late", ("late",), ["late"])
            if not done.done():
                loop.call_soon(other_callback)

        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.call_soon(other_callback)
        snaps.take(1, (0,), None, done.set_result)
        part = await done
        return part, seen

    part, seen = asyncio.run(go())
    assert part.states["count"]["base"] == 1
    assert any(0 < n < len(keys) for n in seen)  # other callbacks ran while rows were being marked
    changed = [k for k in keys if cache.get(k) == ("changed",)]
    assert len(changed) == 1
    assert set(cache._clean.sizes) == set(keys) - set(changed)  # every row the base wrote, and only those
    assert cache.take_unwritten() == {changed[0]: ("changed",), "late": ("late",)}
    snaps.close()


def test_a_base_is_flushed_by_rocksdb_before_its_checkpoint(tmp_path, monkeypatch):
    """The checkpoint would flush the memtable holding the interpreter lock: a base has
    RocksDB flush it first, while the event loop goes on."""
    snaps = StageSnapshots(str(tmp_path / "store"), "f-s-0", None, base_every_s=3600)
    cache = snaps.backend("count", append)
    for k in range(500):
        cache.put(k, (k,))
    in_memtable = []
    checkpoint = cache.checkpoint

    def recording_checkpoint(dest):
        in_memtable.append(cache.db._db.property_int_value("rocksdb.num-entries-active-mem-table"))
        return checkpoint(dest)

    monkeypatch.setattr(cache, "checkpoint", recording_checkpoint)
    part = _take(snaps, 1)
    assert part.states["count"]["base"] == 1
    assert in_memtable == [0]
    snaps.close()
    restored = StageSnapshots(str(tmp_path / "store"), "f-s-0", SnapshotPart(states={"count": part.states["count"]}))
    restored.backend("count", append)
    assert _states(restored, "count") == {k: (k,) for k in range(500)}
    restored.close()


def test_a_remote_store_is_written_through_the_io_thread(tmp_path):
    from driftstream.snapshots.changelog import decode_delta

    # pyarrow's in-memory mock filesystem stands in for s3:// or hdfs://.
    snaps = StageSnapshots("mock:///bucket/job", "f-s-0", None, base_every_s=3600)
    assert snaps._io is not None
    cache = snaps.backend("count", append)
    cache.fold("k", (1,), [1])
    assert _take(snaps, 1).states["count"]["base"] == 1
    cache.fold("k", (1, 2), [2])
    assert _take(snaps, 2).states["count"] == {"participant": "f-s-0-count", "base": 1, "deltas": [2]}
    rows = decode_delta(snaps.store.get_file(2, "f-s-0-count", DELTA_FILE))
    assert [kind for _, kind, _ in rows] == ["inputs"]
    assert sorted(snaps.store.snapshot_ids()) == [1, 2]
    snaps.close()
