"""A damaged snapshot file on Ray: the resume sets the snapshot aside and restores the one
before, with exactly the output of an undamaged run; with none left, a clear error."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Optional

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.model.errors import FlowError
from driftstream.snapshots.store import QUARANTINED, SnapshotStore

from tests.engine.control.test_exactly_once import N, build, failure_free_output

pytestmark = pytest.mark.ray


def run_then_stop(flow, tmp_path: Path) -> SnapshotStore:
    out = tmp_path / "out"
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    deadline = time.time() + 120
    while not (out.exists() and len(read_file_sink(out, "out")) >= N // 3):
        assert time.time() < deadline, handle.status()
        time.sleep(0.05)
    handle.stop(timeout=60)
    store = SnapshotStore(str(tmp_path / "snaps"))
    assert len(store.committed_ids()) >= 2
    return store


def damage(store: SnapshotStore, snapshot_id: int, required: bool = True) -> Optional[Path]:
    """Flip a byte in the first state file of the stateful step's instances in ``snapshot_id``
    (one without files of its own is built on older ones: ``required=False`` passes it by)."""
    root = Path(store.uri) / f"{snapshot_id:010d}"
    files = sorted(p for p in root.rglob("*") if p.is_file() and "by_key" in str(p.relative_to(root))
                   and not p.name.endswith((".sum", ".sums.json")) and p.stat().st_size > 0)
    if not files and not required:
        return None
    assert files, f"no state file in {root}: {sorted(root.rglob('*'))}"
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    return files[0]


def test_a_damaged_snapshot_falls_back_to_the_one_before_and_with_none_left_the_error_says_what_to_do(ray_session, tmp_path,
                                                                                                       tmp_path_factory):
    expected = failure_free_output(tmp_path_factory)  # a failure-free run's output
    flow = build("cs", FileSink(tmp_path / "out", name="out"), paced=True)
    store = run_then_stop(flow, tmp_path)
    newest = store.committed_ids()[-1]
    damaged = damage(store, newest)

    flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"), resume=True)
    assert read_file_sink(tmp_path / "out", "out") == expected  # nothing lost, nothing twice
    assert (Path(store.uri) / f"{newest:010d}" / QUARANTINED).exists()  # set aside, kept for a look
    note = (Path(store.uri) / f"{newest:010d}" / "CORRUPT.txt").read_text()
    assert damaged.name in note and "differs from what was written" in note

    # Every snapshot left damaged: the resume falls back from one to the other, then fails
    # before any output, naming the file. Two are enough for the chain (each fallback is a
    # launch of the flow's actors): the older ones are set aside first.
    for sid in store.committed_ids():
        damage(store, sid, required=False)
    for sid in store.committed_ids()[:-2]:
        store.quarantine(sid, "set aside by the test")
    with pytest.raises(FlowError, match="no older committed snapshot .* fresh=True"):
        flow.run(parallelism=2, guarantee="exactly-once", snapshot_dir=str(tmp_path / "snaps"), resume=True)
    assert read_file_sink(tmp_path / "out", "out") == expected


def test_a_damaged_newest_base_falls_back_to_the_snapshot_before_that_base(ray_session, tmp_path, tmp_path_factory):
    """Retention keeps, beside the newest two snapshots (both on the newest base here), the
    newest one before that base: a damaged file of the base falls back to it, with exactly
    the output of an undamaged run (with only the newest two kept, nothing was left)."""
    expected = failure_free_output(tmp_path_factory)
    flow = build("cb", FileSink(tmp_path / "out", name="out"), paced=True, rate=600)  # 10 s: bases every 5 s
    snaps = str(tmp_path / "snaps")
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=snaps)
    watch, first, deadline = SnapshotStore(snaps), None, time.time() + 120
    for turn in itertools.count():  # until every chain has a second base, and the newest is two past it
        assert time.time() < deadline and (turn % 10 or handle.status()["running"]), handle.status()
        latest = watch.read_latest_manifest()
        if latest is not None and latest["bases"]:
            first = first or min(latest["bases"])
            if min(latest["bases"]) > first and latest["snapshot_id"] >= max(latest["bases"]) + 2:
                break
        time.sleep(0.05)
    handle.stop(timeout=60)
    store = SnapshotStore(snaps)
    store.prune()  # as a commit does: the stop's final snapshot may have come between two prunes
    newest = store.committed_ids()[-1]
    manifest = store.read_manifest(newest)
    # The chain on the oldest base: every snapshot from it on is built on it.
    chain = min((c for part in manifest["parts"].values() for c in part["states"].values()), key=lambda c: c["base"])
    base = chain["base"]
    requires = {sid: store.read_manifest(sid)["requires"] for sid in store.committed_ids()}
    assert all(sid == base or base in requires[sid] for sid in sorted(requires)[-2:])  # the newest two: on the base
    assert [sid for sid in requires if sid < base], requires  # kept: one on an older base
    part_dir = Path(snaps) / f"{base:010d}" / chain["participant"]
    state_file = max((p for p in part_dir.rglob("*") if p.is_file() and not p.name.endswith(".sums.json")), key=lambda p: p.stat().st_size)
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.unlink()  # a hard link to the actor's checkpoint: replace it rather than change both
    state_file.write_bytes(bytes(data))

    # The resume at build's usual pace (the output does not depend on it): 600/s was for the bases.
    resumed = build("cb", FileSink(tmp_path / "out", name="out"), paced=True)
    resumed.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=snaps, resume=True)
    assert read_file_sink(tmp_path / "out", "out") == expected  # nothing lost, nothing twice
    note = (Path(snaps) / f"{newest:010d}" / "CORRUPT.txt").read_text()
    assert state_file.name in note and "differs from what was written" in note
