"""The files of a snapshot store: :class:`SnapshotFiles` (participants' checkpoint directories
and single files, checked by their sums) and the store's layout on the filesystem.

>>> import tempfile
>>> files = SnapshotFiles(tempfile.mkdtemp())
>>> files.put_file(3, "acker", "delta", b"x"); files.get_file(3, "acker", "delta")
b'x'
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any, Optional, Union

from driftstream.snapshots.checksums import DIR_SUMS, FILE_SUM, CorruptSnapshot, check, check_dir, crc, dir_sums

MANIFEST = "MANIFEST.json"
QUARANTINED = "MANIFEST.corrupt.json"  # a committed manifest whose files turned out corrupt
CORRUPT_NOTE = "CORRUPT.txt"
_PARTICIPANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*\Z")  # one path segment; '.' and '_' prefixes are ours
_ID_DIGITS = 10  # zero-padded directory names, so a listing sorts like the ids (ids may outgrow it)

PathLike = Union[str, "os.PathLike[str]"]


@cache
def _pafs() -> Any:
    """``pyarrow.fs``, imported when a store first needs it: every actor process imports this
    module, and pyarrow (with numpy) costs ~0.1 s of an actor's start."""
    import pyarrow.fs

    return pyarrow.fs


class SnapshotFiles:
    """The files of a store's snapshots under ``uri`` (a local directory, or any URI
    ``pyarrow.fs`` opens: ``s3://``, ``gs://``, ``hdfs://``): each participant's checkpoint
    directory and single files, with the checksums that tell a corrupt one. Manifests and
    retention are :class:`~driftstream.snapshots.store.SnapshotStore`'s, built on it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        # A plain path (even relative) is a local directory, opened when first needed: an
        # actor's start then imports no pyarrow (its deltas are written with os calls).
        self._fs: Any = None
        if "://" in uri:
            self._fs, root = _pafs().FileSystem.from_uri(uri)
            self.root = root.rstrip("/")
        else:
            self.root = os.path.abspath(uri).rstrip("/")
        # Per participant: the sums of its last uploaded checkpoint's files, by inode (dir_sums).
        self._known_sums: dict = {}

    @property
    def fs(self) -> Any:
        """The store's ``pyarrow.fs`` filesystem."""
        if self._fs is None:
            self._fs = _pafs().LocalFileSystem()
        return self._fs

    @property
    def _local(self) -> Any:
        return _pafs().LocalFileSystem()

    @property
    def is_local(self) -> bool:
        """True when the store is a directory of this machine (writes cost a page-cache copy)."""
        return self._fs is None or isinstance(self._fs, _pafs().LocalFileSystem)

    # -- checkpoint files ---------------------------------------------------------------

    def upload(self, snapshot_id: int, participant: str, local_dir: PathLike) -> str:
        """Copy the files under ``local_dir`` to ``<root>/<snapshot_id>/<participant>/``.

        A previous upload of the same participant to the same snapshot is replaced,
        so a retried upload leaves no stale files. Returns the destination path in
        the store's filesystem. Cost: the bytes of ``local_dir``.
        """
        src = Path(local_dir)
        if not src.is_dir():
            raise NotADirectoryError(f"{src} is not a directory")
        dest = self._participant_dir(snapshot_id, participant)
        if self.fs.get_file_info(dest).type != _pafs().FileType.NotFound:
            self.fs.delete_dir(dest)
        self.fs.create_dir(dest, recursive=True)
        # per participant: its checkpoints share their table files (hard links)
        sums = json.dumps(dir_sums(src, self._known_sums.setdefault(participant, {}))).encode()
        if not (self.is_local and _link_tree(src, Path(dest))):
            _pafs().copy_files(str(src.resolve()), dest, source_filesystem=self._local, destination_filesystem=self.fs)
        self._write(dest, f"{dest}/{DIR_SUMS}", sums)  # last: a part with its sums is whole
        return dest

    def put_file(self, snapshot_id: int, participant: str, name: str, data: bytes) -> None:
        """Write one file of a participant (e.g. a state delta), replacing any earlier one. Cost: its bytes."""
        dest = self._participant_dir(snapshot_id, participant)
        path = f"{dest}/{_segment('file name', name)}"
        self._write(dest, path, data)
        self._write(dest, path + FILE_SUM, json.dumps(crc(data)).encode())

    def _write(self, directory: str, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in ``directory`` (created if missing). On a local store
        with ``os`` calls: a fifth of pyarrow's cost, at a delta and a manifest per snapshot."""
        if self.is_local:
            os.makedirs(directory, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            return
        self.fs.create_dir(directory, recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def get_file(self, snapshot_id: int, participant: str, name: str) -> bytes:
        """The bytes of a file written by :meth:`put_file`; FileNotFoundError if there is none,
        CorruptSnapshot if they are not the bytes written (files of stores from before
        checksums have no sum, and are read unchecked)."""
        path = f"{self._participant_dir(snapshot_id, participant)}/{_segment('file name', name)}"
        if self.fs.get_file_info(path).type != _pafs().FileType.File:
            raise FileNotFoundError(f"snapshot {snapshot_id} has no file {name!r} for participant {participant!r} in {self.uri}")
        with self.fs.open_input_stream(path) as f:
            data = f.read()
        expected = self._read_json(path + FILE_SUM, snapshot_id)
        if expected is not None:
            check(crc(data), expected, f"snapshot {snapshot_id}, part {participant}: {path}", snapshot_id, path)
        return data

    def _read_json(self, path: str, snapshot_id: int) -> Optional[Any]:
        """A sums file's content; None if there is none; CorruptSnapshot if it does not parse."""
        if self.fs.get_file_info(path).type != _pafs().FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            raw = f.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise CorruptSnapshot(f"snapshot {snapshot_id}: the checksums {path} do not parse", snapshot_id, path) from None

    def download(self, snapshot_id: int, participant: str, local_dir: PathLike) -> Path:
        """Copy a participant's files of a snapshot into ``local_dir`` (which must not exist).

        The result is a private copy: a RocksDB checkpoint downloaded this way can be
        opened in place. Cost: the bytes of the participant's files.
        """
        src = self._participant_dir(snapshot_id, participant)
        if self.fs.get_file_info(src).type != _pafs().FileType.Directory:
            raise FileNotFoundError(f"snapshot {snapshot_id} has no files for participant {participant!r} in {self.uri}")
        dest = Path(local_dir)
        if dest.exists():
            raise FileExistsError(f"download target {dest} already exists")
        dest.mkdir(parents=True)
        _pafs().copy_files(src, str(dest.resolve()), source_filesystem=self.fs, destination_filesystem=self._local)
        sums = self._read_json(f"{src}/{DIR_SUMS}", snapshot_id)
        if sums is not None:  # stores from before checksums have none
            check_dir(dest, sums, f"snapshot {snapshot_id}, part {participant} ({src})", snapshot_id)
            (dest / DIR_SUMS).unlink()
        return dest

    def _snapshot_dir(self, snapshot_id: int) -> str:
        _check_id(snapshot_id)
        return f"{self.root}/{snapshot_id:0{_ID_DIGITS}d}"

    def _participant_dir(self, snapshot_id: int, participant: str) -> str:
        participant = _segment("participant name", participant, reserved=(MANIFEST, QUARANTINED, CORRUPT_NOTE))
        return f"{self._snapshot_dir(snapshot_id)}/{participant}"


def _link_tree(src: Path, dest: Path) -> bool:
    """Hard-link the files under ``src`` into ``dest`` (a local store on the same filesystem):
    O(files) instead of O(bytes). Safe for checkpoints, whose files are never written again.
    False (and nothing left behind) if linking is not possible, e.g. across filesystems."""
    linked = []
    try:
        for path in src.rglob("*"):
            target = dest / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                os.link(path, target)
                linked.append(target)
    except OSError:
        for target in linked:
            target.unlink(missing_ok=True)
        return False
    return True


def _segment(what: str, name: str, reserved: tuple = ()) -> str:
    """``name`` if it is safe as one path segment of the store (a participant or file name)."""
    if not isinstance(name, str) or not _PARTICIPANT.match(name) or name in reserved:
        raise ValueError(
            f"{what} {name!r} must be one path segment of letters, digits, '.', '_', '=' or '-', "
            "starting with a letter or digit"
        )
    return name


def _check_id(snapshot_id: Any) -> None:
    if type(snapshot_id) is not int or snapshot_id < 0:
        raise ValueError(f"a snapshot id is a non-negative int, not {snapshot_id!r}")
