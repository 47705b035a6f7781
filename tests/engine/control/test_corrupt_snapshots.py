"""A damaged snapshot file on Ray: the resume sets the snapshot aside and restores the one
before, with exactly the output of an undamaged run; with none left, a clear error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import pytest

from driftstream.barriers.file_sink import FileSink, read_file_sink
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
