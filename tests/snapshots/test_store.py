"""SnapshotStore over pyarrow.fs: uploads and downloads of checkpoint directories,
atomic manifests (temporary and torn files are never read), retention of the newest
committed snapshots, and a RocksDB checkpoint's full trip through the store."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.store import MANIFEST, SnapshotStore


def _checkpoint_dir(path: Path, files: dict) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(str(tmp_path / "store"))


def _snap_dir(store: SnapshotStore, snapshot_id: int) -> Path:
    return Path(store._snapshot_dir(snapshot_id))


# -- files --------------------------------------------------------------------------------


def test_upload_then_download_copies_every_file(store, tmp_path):
    files = {"000009.sst": b"\x00" * 5000, "CURRENT": b"MANIFEST-000005\n", "sub/nested": b"n"}
    src = _checkpoint_dir(tmp_path / "cp", files)
    dest = store.upload(3, "wordcount-1", src)
    assert dest.endswith("/0000000003/wordcount-1")
    assert _tree(store.download(3, "wordcount-1", tmp_path / "down")) == files


def test_a_repeated_upload_replaces_the_previous_one(store, tmp_path):
    store.upload(1, "p", _checkpoint_dir(tmp_path / "a", {"old.sst": b"1", "CURRENT": b"a"}))
    store.upload(1, "p", _checkpoint_dir(tmp_path / "b", {"CURRENT": b"b"}))
    assert _tree(store.download(1, "p", tmp_path / "down")) == {"CURRENT": b"b"}


def test_download_errors(store, tmp_path):
    with pytest.raises(FileNotFoundError, match="participant 'p'"):
        store.download(1, "p", tmp_path / "down")
    store.upload(1, "p", _checkpoint_dir(tmp_path / "cp", {"x": b"x"}))
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError):
        store.download(1, "p", tmp_path / "exists")


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "_x", MANIFEST, "a b"])
def test_participant_names_must_be_one_plain_path_segment(store, tmp_path, name):
    with pytest.raises(ValueError, match="participant name"):
        store.upload(1, name, _checkpoint_dir(tmp_path / "cp", {"x": b"x"}))


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True])
def test_snapshot_ids_are_non_negative_ints(store, bad):
    with pytest.raises(ValueError, match="non-negative int"):
        store.write_manifest(bad, {})


# -- manifests ------------------------------------------------------------------------------


def test_nothing_committed_reads_as_none(tmp_path):
    assert SnapshotStore(str(tmp_path / "never-created")).read_latest_manifest() is None


def test_the_latest_committed_manifest_wins(store):
    store.write_manifest(1, {"time": [1]})
    store.write_manifest(2, {"time": [2]})
    assert store.read_latest_manifest() == {"time": [2], "snapshot_id": 2}
    assert store.read_manifest(1) == {"time": [1], "snapshot_id": 1}
    assert store.committed_ids() == [1, 2]


def test_a_manifest_is_plain_json_and_no_temporary_file_remains(store):
    store.write_manifest(5, {"sources": {"0": [[0, 17, 123.5]]}, "time": [9, 0, 1, 4]})
    snap = _snap_dir(store, 5)
    assert [p.name for p in snap.iterdir()] == [MANIFEST]
    stored = json.loads((snap / MANIFEST).read_text())
    assert stored.pop("checksum").startswith("sha256:")
    assert stored == {"sources": {"0": [[0, 17, 123.5]]}, "time": [9, 0, 1, 4], "snapshot_id": 5}


def test_a_half_written_temporary_manifest_is_ignored(store):
    store.write_manifest(1, {"time": [1]})
    snap2 = _snap_dir(store, 2)  # a coordinator that died while writing snapshot 2's manifest
    snap2.mkdir(parents=True)
    (snap2 / f".{MANIFEST}.0123abcd.tmp").write_text('{"time": [2], "snaps')
    (snap2 / "count-0").mkdir()
    (snap2 / "count-0" / "CURRENT").write_text("x")
    assert store.committed_ids() == [1]
    assert store.read_latest_manifest() == {"time": [1], "snapshot_id": 1}
    store.write_manifest(2, {"time": [2]})  # the retry commits over the leftovers
    assert store.read_latest_manifest() == {"time": [2], "snapshot_id": 2}


def test_a_torn_committed_manifest_falls_back_to_the_one_before(store, caplog):
    store.write_manifest(1, {"time": [1]})
    store.write_manifest(2, {"time": [2]})
    (_snap_dir(store, 2) / MANIFEST).write_text('{"time": [')  # e.g. a power cut on an unsynced disk
    with caplog.at_level(logging.WARNING, logger="driftstream.snapshots.store"):
        assert store.read_latest_manifest() == {"time": [1], "snapshot_id": 1}
    assert "does not parse" in caplog.text


@pytest.mark.parametrize(
    "manifest, error",
    [({"time": (1, 2)}, ValueError), ({1: "int key"}, (TypeError, ValueError)), ({"x": float("nan")}, ValueError), ({"x": {1, 2}}, TypeError),
     ({"snapshot_id": 9}, ValueError), ([1], TypeError)],
    ids=["tuple", "int-key", "nan", "set", "other-id", "not-a-dict"],
)
def test_manifests_must_survive_json_unchanged(store, manifest, error):
    with pytest.raises(error):
        store.write_manifest(1, manifest)
    assert store.snapshot_ids() == []  # refused before anything was written


def test_commits_cannot_go_backwards_but_may_be_repeated(store):
    store.write_manifest(4, {"v": 1})
    store.write_manifest(4, {"v": 2})
    assert store.read_latest_manifest() == {"v": 2, "snapshot_id": 4}
    with pytest.raises(ValueError, match="older than the newest committed"):
        store.write_manifest(3, {})


# -- retention ---------------------------------------------------------------------------------


def test_retention_keeps_the_last_two_committed_snapshots(store, tmp_path):
    cp = _checkpoint_dir(tmp_path / "cp", {"CURRENT": b"x"})
    store.upload(2, "p", cp)  # abandoned: never committed, older than what is kept
    for i in (1, 3, 4, 5):
        store.upload(i, "p", cp)
        store.write_manifest(i, {"n": i})
    store.upload(6, "p", cp)  # in progress: newer than every commit
    assert store.committed_ids() == [4, 5]
    assert store.snapshot_ids() == [4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["0000000004", "0000000005", "0000000006"]
    assert _tree(store.download(4, "p", tmp_path / "down")) == {"CURRENT": b"x"}


def test_retention_with_keep_three_and_explicit_prune(tmp_path):
    store = SnapshotStore(str(tmp_path / "store"), keep=3)
    for i in range(1, 6):
        store.write_manifest(i, {})
    assert store.committed_ids() == [3, 4, 5]
    assert store.prune() == []
    with pytest.raises(ValueError, match="keep"):
        SnapshotStore(str(tmp_path / "x"), keep=0)


def test_deleting_a_snapshot_removes_its_manifest_and_files(store, tmp_path):
    store.upload(1, "p", _checkpoint_dir(tmp_path / "cp", {"a": b"a"}))
    store.write_manifest(1, {})
    store.delete_snapshot(1)
    store.delete_snapshot(1)  # already gone: nothing to do
    assert store.read_latest_manifest() is None and store.snapshot_ids() == []


# -- URIs ----------------------------------------------------------------------------------------


def test_plain_paths_file_uris_and_relative_paths_name_the_same_store(tmp_path, monkeypatch):
    SnapshotStore(str(tmp_path / "s")).write_manifest(1, {"via": "path"})
    assert SnapshotStore(f"file://{tmp_path}/s").read_latest_manifest() == {"via": "path", "snapshot_id": 1}
    monkeypatch.chdir(tmp_path)
    assert SnapshotStore("s").read_latest_manifest() == {"via": "path", "snapshot_id": 1}


def test_a_non_local_filesystem_works_the_same(tmp_path):
    # pyarrow's in-memory mock filesystem stands in for s3:// or hdfs:// (same FileSystem API, paths without a leading slash).
    store = SnapshotStore("mock:///bucket/job", keep=2)
    cp = _checkpoint_dir(tmp_path / "cp", {"CURRENT": b"c", "1.sst": b"s"})
    for i in (1, 2, 3):
        store.upload(i, "p", cp)
        store.write_manifest(i, {"i": i})
    assert store.committed_ids() == [2, 3]
    assert store.read_latest_manifest() == {"i": 3, "snapshot_id": 3}
    assert _tree(store.download(3, "p", tmp_path / "down")) == {"CURRENT": b"c", "1.sst": b"s"}


# -- end to end ------------------------------------------------------------------------------------


def test_a_rocksdb_checkpoint_through_the_store_restores_the_same_states(tmp_path):
    states = {f"k{i}": {"count": i, "seen": [i, i + 1]} for i in range(500)}
    with RocksDBBackend(tmp_path / "work") as b:
        for k, v in states.items():
            b.put(k, v)
        cp = b.checkpoint(tmp_path / "cp")
        b.put("k1", "after the snapshot")
    store = SnapshotStore(f"file://{tmp_path}/store")
    store.upload(1, "count-0", cp)
    store.write_manifest(1, {"participants": ["count-0"], "time": [7, 0, 0, 7]})

    recovered = SnapshotStore(str(tmp_path / "store"))  # a fresh process's view
    manifest = recovered.read_latest_manifest()
    [participant] = manifest["participants"]
    local = recovered.download(manifest["snapshot_id"], participant, tmp_path / "recovered")
    with RocksDBBackend(local) as r:  # a download is a private copy: open it in place
        assert dict(r.items()) == states


def test_prune_keeps_the_snapshots_a_kept_manifest_requires(tmp_path):
    store = SnapshotStore(str(tmp_path / "store"), keep=2)
    for snapshot_id in range(1, 6):
        store.put_file(snapshot_id, "p", "DELTA", b"x")
        # Every snapshot is built on base 1 plus the deltas up to itself.
        store.write_manifest(snapshot_id, {"requires": list(range(1, snapshot_id)), "bases": [1]})
    assert store.snapshot_ids() == [1, 2, 3, 4, 5]  # 4 and 5 are kept, and they require 1..4
    assert store.committed_ids() == [4, 5]  # 1..3 are files of them, no longer snapshots to restore
    assert store.get_file(1, "p", "DELTA") == b"x"


def _chains(store: SnapshotStore, bases: set, last: int) -> None:
    """Commit snapshots 1..last of one participant: a base at each id in ``bases``, else a delta."""
    base, deltas = None, []
    for sid in range(1, last + 1):
        if sid in bases:
            base, deltas = sid, []
        else:
            deltas.append(sid)
        store.put_file(sid, "p", "DELTA", b"x")
        store.write_manifest(sid, {"requires": [i for i in (base, *deltas) if i != sid], "bases": [base]})


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_an_older_manifest_on_another_base_than_the_newest(tmp_path, keep):
    """One damaged file of the newest base (or of a delta on it) leaves a manifest to
    restore: the newest of the previous base's chain stays, with the files it needs."""
    store = SnapshotStore(str(tmp_path / "store"), keep=keep)
    _chains(store, {1, 6, 11}, 8)  # bases at 1 and 6; 7 and 8 deltas on 6
    window = list(range(9 - keep, 9))
    assert store.committed_ids() == [5, *window]  # 5: the newest on base 1
    assert store.requires(5) == [1, 2, 3, 4] and not set(store.requires(5)) & {6, *window}
    assert store.snapshot_ids() == [1, 2, 3, 4, 5, 6, 7, 8]
    _chains_on = SnapshotStore(str(tmp_path / "store"), keep=keep)  # a fresh process's view decides alike
    assert _chains_on.prune() == [] and _chains_on.committed_ids() == [5, *window]

    # A base at 11: the chain on 6 is the independent one now (its newest, 10); base 1's goes.
    for sid in (9, 10, 11):
        requires = [6, *range(7, sid)] if sid < 11 else []
        store.put_file(sid, "p", "DELTA", b"x")
        store.write_manifest(sid, {"requires": requires, "bases": [6 if sid < 11 else 11]})
    assert store.committed_ids() == sorted({10, *range(12 - keep, 12)})
    assert store.snapshot_ids() == ([6, 7, 8, 9, 10, 11] if keep < 6 else list(range(1, 12)))
    store.put_file(12, "p", "DELTA", b"x")
    store.write_manifest(12, {"requires": [11], "bases": [11]})
    assert store.committed_ids() == sorted({10, *range(13 - keep, 13)})
    assert store.snapshot_ids() == [6, 7, 8, 9, 10, 11, 12]


def test_retention_takes_the_oldest_base_of_the_newest_manifests_participants(tmp_path):
    """Participants take bases at different snapshots: the independent manifest is older than
    every file the newest is built on."""
    store = SnapshotStore(str(tmp_path / "store"), keep=2)
    # p at 1 and 5, q at 1 and 7: 8 requires p's 5..7 and q's 7
    for sid in range(1, 9):
        p = [1, *range(2, sid)] if sid < 5 else [5, *range(6, sid)]
        q = [1, *range(2, sid)] if sid < 7 else [7, *range(8, sid)]
        store.write_manifest(sid, {"requires": sorted({*p, *q} - {sid}), "bases": sorted({p[0], q[0]})})
        if sid == 6:  # q on base 1 still: nothing is independent of 6, but 4 will be of q's next base
            assert store.committed_ids() == [4, 5, 6]
    assert store.committed_ids() == [4, 6, 7, 8]  # 4: before 5, p's base, on neither new base; 6: before q's 7
    assert store.snapshot_ids() == list(range(1, 9))
    for sid in (9, 10):  # p takes a base at 10: 4 goes; 6 stays, before q's base, with q's chain on 1
        p, q = ([5, *range(6, sid)] if sid < 10 else [10]), [7, *range(8, sid)]
        store.write_manifest(sid, {"requires": sorted({*p, *q} - {sid}), "bases": sorted({p[0], q[0]})})
    assert store.committed_ids() == [6, 9, 10] and store.snapshot_ids() == list(range(1, 11))


def test_retention_of_manifests_that_do_not_name_their_bases(tmp_path):
    """Written before ``"bases"``: any snapshot the newest requires may be a base; the newest
    manifest before each stays (more than needed, never less)."""
    store = SnapshotStore(str(tmp_path / "store"), keep=10)
    _chains(store, {1, 4}, 6)
    for sid in range(1, 7):  # as an older build wrote them
        path = _snap_dir(store, sid) / MANIFEST
        data = json.loads(path.read_text())
        del data["bases"], data["checksum"]
        path.write_text(json.dumps(data))
    fresh = SnapshotStore(str(tmp_path / "store"), keep=2)
    fresh.prune()
    assert fresh.committed_ids() == [3, 4, 5, 6]  # 3: before base 4 (and 4, 5 before deltas 5, 6)
    assert fresh.snapshot_ids() == [1, 2, 3, 4, 5, 6]  # 1, 2: 3's chain


def test_an_altered_manifest_is_skipped_for_the_one_before_and_with_none_left_refused(store, caplog):
    """A valid-JSON edit of one source position (what lost 64 rows in the review) is found by
    the manifest's checksum: the restore takes the manifest before."""
    from driftstream.snapshots.store import NoUsableManifest

    store.write_manifest(1, {"parts": {"src/0": {"sources": {"0": [100, 7]}}}})
    store.write_manifest(2, {"parts": {"src/0": {"sources": {"0": [200, 9]}}}})
    path = _snap_dir(store, 2) / MANIFEST
    path.write_text(path.read_text().replace("[200, 9]", "[264, 9]"))
    json.loads(path.read_text())  # still valid JSON
    with caplog.at_level(logging.WARNING, logger="driftstream.snapshots.store"):
        assert store.read_latest_manifest()["parts"]["src/0"]["sources"]["0"] == [100, 7]
        assert store.read_manifest(2) is None
    assert str(path) in caplog.text and "does not match its checksum" in caplog.text

    path1 = _snap_dir(store, 1) / MANIFEST
    data = json.loads(path1.read_text())
    data["checksum"] = "sha256:" + "0" * 64
    path1.write_text(json.dumps(data))
    with pytest.raises(NoUsableManifest, match=r"no committed manifest can be used .*0000000002/MANIFEST.json does not match .*put back"):
        store.read_latest_manifest()


def test_a_manifest_from_before_checksums_is_read_unchecked_and_said_once(store, caplog):
    store.write_manifest(1, {"t": [1]})
    store.write_manifest(2, {"t": [2]})
    for sid in (1, 2):
        path = _snap_dir(store, sid) / MANIFEST
        data = json.loads(path.read_text())
        del data["checksum"]
        path.write_text(json.dumps(data))
    with caplog.at_level(logging.INFO, logger="driftstream.snapshots.store"):
        assert store.read_latest_manifest() == {"t": [2], "snapshot_id": 2}
        assert store.read_manifest(1) == {"t": [1], "snapshot_id": 1}
    assert caplog.text.count("has no checksum") == 1
    with pytest.raises(ValueError, match="checksum"):
        store.write_manifest(3, {"checksum": "mine"})


def test_a_manifest_read_back_and_committed_again_keeps_its_checksum_valid(store):
    manifest = {"t": [1.5, float("-inf")], "name": "été ☃", "big": 2**70, "nested": {"b": [1, {"a": None}]}}
    store.write_manifest(1, manifest)
    again = store.read_latest_manifest()
    assert again == {**manifest, "snapshot_id": 1}
    store.write_manifest(2, {k: v for k, v in again.items() if k != "snapshot_id"})
    assert store.read_manifest(2) == {**manifest, "snapshot_id": 2}


def test_prune_every_n_commits(tmp_path):
    store = SnapshotStore(str(tmp_path / "store"), keep=1, prune_every=3)
    for snapshot_id in range(1, 6):
        store.write_manifest(snapshot_id, {"bases": [snapshot_id]})  # each a base: the one before is independent
    assert store.committed_ids() == [2, 3, 4, 5]  # pruned after commit 3 only
    store.write_manifest(6, {"bases": [6]})
    assert store.committed_ids() == [5, 6]


# -- checksums ----------------------------------------------------------------------------


def test_a_damaged_delta_or_checkpoint_file_is_refused_by_name(tmp_path):
    from driftstream.snapshots.checksums import CorruptSnapshot

    store = SnapshotStore(str(tmp_path / "store"))
    store.put_file(1, "count-0", "DELTA", b"0123456789")
    assert store.get_file(1, "count-0", "DELTA") == b"0123456789"
    delta = tmp_path / "store" / "0000000001" / "count-0" / "DELTA"
    delta.write_bytes(b"01234")  # truncated
    with pytest.raises(CorruptSnapshot, match="DELTA differs from what was written .5 bytes where 10 were written") as err:
        store.get_file(1, "count-0", "DELTA")
    assert err.value.snapshot_id == 1

    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "a.sst").write_bytes(b"rows" * 100)
    (cp / "CURRENT").write_bytes(b"MANIFEST-1")
    store.upload(2, "count-0", cp)
    assert sorted(p.name for p in store.download(2, "count-0", tmp_path / "ok").iterdir()) == ["CURRENT", "a.sst"]
    stored = tmp_path / "store" / "0000000002" / "count-0" / "a.sst"
    stored.unlink()  # a hard link to cp's file: replace it rather than change both
    stored.write_bytes(b"rowz" * 100)
    with pytest.raises(CorruptSnapshot, match=r"a.sst differs from what was written \(CRC-32"):
        store.download(2, "count-0", tmp_path / "bad")
    (tmp_path / "store" / "0000000002" / "count-0" / "CURRENT").unlink()
    with pytest.raises(CorruptSnapshot, match="CURRENT is missing"):
        store.download(2, "count-0", tmp_path / "bad2")


def test_a_quarantined_snapshot_is_no_longer_committed_and_never_pruned(tmp_path):
    store = SnapshotStore(str(tmp_path / "store"), keep=2)
    for sid in (1, 2):
        store.put_file(sid, "p", "DELTA", b"x")
        store.write_manifest(sid, {"t": [sid]})
    store.quarantine(2, "p: DELTA differs")
    assert store.committed_ids() == [1] and store.read_latest_manifest()["snapshot_id"] == 1
    for sid in (3, 4):
        store.put_file(sid, "p", "DELTA", b"x")
        store.write_manifest(sid, {"t": [sid]})
    assert store.committed_ids() == [3, 4] and store.snapshot_ids() == [2, 3, 4]  # 1 pruned, 2 kept for a look
    assert (tmp_path / "store" / "0000000002" / "CORRUPT.txt").read_text() == "p: DELTA differs"


def test_the_snapshots_after_the_newest_pinned_one_are_set_aside(tmp_path):
    """A rollback to the snapshot a vote certified (``pinned``) takes the newer committed ones out of
    use, so that the newest committed is that one; without ``pinned`` nothing goes."""
    store = SnapshotStore(str(tmp_path / "store"), keep=5, pinned=lambda sid: sid == 2)
    for sid in (1, 2, 3, 4):
        store.put_file(sid, "p", "DELTA", b"x")
        store.write_manifest(sid, {"t": [sid]})
    assert store.set_aside_unpinned("a rollback") == [3, 4]
    assert store.committed_ids() == [1, 2] and store.read_latest_manifest()["snapshot_id"] == 2
    assert (tmp_path / "store" / "0000000003" / "CORRUPT.txt").read_text() == "a rollback"
    assert SnapshotStore(str(tmp_path / "other")).set_aside_unpinned("a rollback") == []


def test_a_checkpoints_table_files_shared_with_the_last_upload_are_not_read_again_and_damage_is_still_found(tmp_path, monkeypatch):
    # each base's checkpoint hard-links the table files of the one before: summed once
    import driftstream.snapshots.checksums as checksums
    from driftstream.snapshots.checksums import CorruptSnapshot

    read: list = []
    real = checksums.file_crc
    monkeypatch.setattr(checksums, "file_crc", lambda p: read.append(Path(p).name) or real(p))
    store = SnapshotStore(str(tmp_path / "store"))
    db = RocksDBBackend(tmp_path / "db")
    for i in range(100):
        db.put(("a", i), [i])
    store.upload(1, "f-s-0", db.checkpoint(tmp_path / "cp1"))
    first = {n for n in read if n.endswith(".sst")}
    read.clear()
    for i in range(100):
        db.put(("b", i), [i])
    store.upload(2, "f-s-0", db.checkpoint(tmp_path / "cp2"))
    assert first and not first & set(read)  # the shared table files: not read again
    assert {n for n in read if n.endswith(".sst")}  # the new one: read
    restored = RocksDBBackend(store.download(2, "f-s-0", tmp_path / "r2"))
    assert restored.get(("a", 7)) == [7] and restored.get(("b", 9)) == [9]
    restored.close()
    shared = tmp_path / "store" / f"{2:010d}" / "f-s-0" / sorted(first)[0]
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shared.write_bytes(bytes(data))  # the store's file (the same inode as the working one's)
    with pytest.raises(CorruptSnapshot, match=sorted(first)[0]):
        store.download(2, "f-s-0", tmp_path / "r2-again")
    db.close()
