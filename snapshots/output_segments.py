"""The output logs' files in a snapshot store: per step that is not deterministic, the segments
its instances wrote (:mod:`.output_log`), under ``<root>/outputs/<flow>-<step>/``.

A segment is written whole under a temporary name and then moved into place (on an object
store an object appears whole), and carries its CRC-32: a listing never shows half a segment,
and a damaged one fails its restore (:class:`~.checksums.CorruptSnapshot`) rather than replay
other outputs than those released. The numbered snapshot folders beside ``outputs`` never
include it (a listing of snapshots takes digits only).

>>> import tempfile
>>> from driftstream.snapshots.output_log import encode_segment, segment_name
>>> files = SnapshotFiles(tempfile.mkdtemp())
>>> seg = OutputSegments(files, "f-noisy")
>>> entries = [((3, 0, 0, 3, (), False), [((3, 0, 0, 3, (), False), 0.5, None)])]
>>> seg.write(segment_name(1, 0, 0, entries), encode_segment(entries))
>>> [seg.read(n) for n in seg.names(since=(3, 0, 0, 3))] == [entries], seg.names(since=(4,))
(True, [])
>>> trim_outputs(files, (4,)), seg.names(since=None)
(1, [])
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from typing import Optional

from driftstream.snapshots.checksums import CorruptSnapshot
from driftstream.snapshots.output_log import OUTPUTS_DIR, decode_segment, segments_below, segments_from
from driftstream.snapshots.snapshot_files import SnapshotFiles, _pafs, _segment

_HEADER = struct.Struct("<IQ")  # CRC-32 and length of what follows


class OutputSegments:
    """The segments of one step's output log (``flow_step``: ``<flow>-<step>``) in ``files``' store."""

    def __init__(self, files: SnapshotFiles, flow_step: str) -> None:
        self.files = files
        self.dir = f"{files.root}/{OUTPUTS_DIR}/{_segment('step', flow_step)}"

    def write(self, name: str, data: bytes) -> None:
        """Store segment ``name`` holding ``data`` (:func:`~.output_log.encode_segment`'s bytes).
        Cost: its bytes, one write and one rename."""
        blob = _HEADER.pack(zlib.crc32(data), len(data)) + data
        path = f"{self.dir}/{_segment('segment', name)}"
        if self.files.is_local:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.dir}/.{name}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
            return
        self.files.fs.create_dir(self.dir, recursive=True)
        with self.files.fs.open_output_stream(path) as out:
            out.write(blob)

    def names(self, since: Optional[tuple]) -> list:
        """The segments that may hold inputs at or after ``since`` (None: all), oldest first."""
        return segments_from(_listing(self.files, self.dir), since)

    def read(self, name: str) -> list:
        """The entries of segment ``name``; CorruptSnapshot if its bytes are not those written."""
        path = f"{self.dir}/{name}"
        with self.files.fs.open_input_stream(path) as f:
            blob = f.read()
        if len(blob) < _HEADER.size:
            raise CorruptSnapshot(f"output log segment {path} is cut short", None, path)
        expected, length = _HEADER.unpack_from(blob)
        data = blob[_HEADER.size:]
        if len(data) != length or zlib.crc32(data) != expected:
            raise CorruptSnapshot(f"output log segment {path} is damaged (its checksum does not match)", None, path)
        return decode_segment(data)


def trim_outputs(files: SnapshotFiles, below: tuple) -> int:
    """Delete every step's segments whose inputs are all below time ``below`` (the oldest
    committed snapshot's T: no restore starts before it); returns how many went. One listing
    per step, one delete per segment."""
    gone = 0
    root = f"{files.root}/{OUTPUTS_DIR}"
    for step_dir in _listing(files, root):
        directory = f"{root}/{step_dir}"
        for name in segments_below(_listing(files, directory), below):
            files.fs.delete_file(f"{directory}/{name}")
            gone += 1
    return gone


def discard_outputs(files: SnapshotFiles) -> None:
    """Delete every output log of the store: a run that starts from the beginning must not
    replay another run's outputs (they are keyed by input time, which the new run reuses)."""
    root = f"{files.root}/{OUTPUTS_DIR}"
    if files.fs.get_file_info(root).type != _pafs().FileType.NotFound:
        files.fs.delete_dir(root)


def _listing(files: SnapshotFiles, directory: str) -> list:
    """The base names in ``directory`` (none if it does not exist)."""
    if files.is_local:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []
    infos = files.fs.get_file_info(_pafs().FileSelector(directory, allow_not_found=True))
    return [i.base_name for i in infos]
