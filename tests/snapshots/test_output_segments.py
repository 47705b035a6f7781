"""The output logs' segments in a snapshot store: written whole, read back checked, trimmed
below a time, discarded for a run from the beginning, and never taken for snapshots."""

from __future__ import annotations

import os

import pytest

from driftstream.ordering.meta import Meta
from driftstream.snapshots.checksums import CorruptSnapshot
from driftstream.snapshots.output_log import encode_segment, segment_name
from driftstream.snapshots.output_segments import OutputSegments, discard_outputs, trim_outputs
from driftstream.snapshots.store import SnapshotStore


def _entries(*times: int) -> list:
    return [(Meta(t, 0, 0, t), [(Meta(t, 0, 0, t), t * 10, None)]) for t in times]


def _write(seg: OutputSegments, written_ns: int, *times: int) -> str:
    entries = _entries(*times)
    name = segment_name(written_ns, 0, written_ns, entries)
    seg.write(name, encode_segment(entries))
    return name


def test_write_read_and_restore_from(tmp_path):
    seg = OutputSegments(SnapshotStore(str(tmp_path)), "f-noisy")
    first, second = _write(seg, 1, 1, 2), _write(seg, 2, 3, 4)
    assert seg.names(since=None) == [first, second]
    assert seg.names(since=(3, 0, 0, 3)) == [second]
    assert seg.read(second) == [(tuple(m), o) for m, o in _entries(3, 4)]
    assert [p for p in os.listdir(seg.dir) if p.startswith(".")] == []  # no temporary file left


def test_a_damaged_segment_fails_its_read(tmp_path):
    seg = OutputSegments(SnapshotStore(str(tmp_path)), "f-noisy")
    name = _write(seg, 1, 1)
    path = os.path.join(seg.dir, name)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptSnapshot, match="damaged"):
        seg.read(name)
    open(path, "wb").write(bytes(data[:5]))
    with pytest.raises(CorruptSnapshot, match="cut short"):
        seg.read(name)


def test_trim_deletes_the_segments_wholly_below(tmp_path):
    store = SnapshotStore(str(tmp_path))
    noisy, other = OutputSegments(store, "f-noisy"), OutputSegments(store, "f-other")
    _write(noisy, 1, 1, 2)
    straddling = _write(noisy, 2, 4, 6)
    _write(other, 3, 3)
    assert trim_outputs(store, (5,)) == 2
    assert noisy.names(None) == [straddling] and other.names(None) == []


def test_the_store_lists_no_snapshot_for_them_and_a_fresh_start_discards_them(tmp_path):
    store = SnapshotStore(str(tmp_path))
    seg = OutputSegments(store, "f-noisy")
    _write(seg, 1, 1)
    assert store.snapshot_ids() == [] and store.read_latest_manifest() is None
    discard_outputs(store)
    assert seg.names(None) == []
    discard_outputs(store)  # nothing left: nothing to do


def test_a_remote_store_writes_through_pyarrow(tmp_path):
    store = SnapshotStore(f"file://{tmp_path}")
    seg = OutputSegments(store, "f-noisy")
    name = _write(seg, 1, 7)
    assert seg.names(since=(7,)) == [name] and seg.read(name) == [(tuple(m), o) for m, o in _entries(7)]
    assert trim_outputs(store, (8,)) == 1 and seg.names(None) == []
