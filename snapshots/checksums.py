"""Checksums of snapshot files: a part that was truncated or altered is found before it is restored.

Each file a participant stores gets its size and CRC-32 recorded beside it (a
checkpoint directory's in one ``.sums.json``, a single file's in ``<name>.sum``);
a restore checks them and raises :class:`CorruptSnapshot`, naming the file, where a
file is missing, shorter, longer or different. The coordinator then falls back to
the previous committed snapshot (see ``engine/control/supervisor.py``). CRC-32 finds
every burst error up to 32 bits and random damage with probability 1 - 2^-32; it is
not a defence against someone who can write the store (they could rewrite the sums).
Cost: one pass over the bytes (zlib's CRC-32, over 1 GB/s).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.sst").write_bytes(b"rows")
>>> sums = dir_sums(d)
>>> sums
{'a.sst': [4, 176944289]}
>>> check_dir(d, sums, "snapshot 3, part count-0")
>>> _ = (d / "a.sst").write_bytes(b"rowz")
>>> check_dir(d, sums, "snapshot 3, part count-0")
Traceback (most recent call last):
...
driftstream.snapshots.checksums.CorruptSnapshot: snapshot 3, part count-0: a.sst differs from what was written (CRC-32 ...
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

#: Where a checkpoint directory's sums are kept, inside it.
DIR_SUMS = ".sums.json"
#: The suffix of a single file's sum, beside it.
FILE_SUM = ".sum"
_CHUNK = 1 << 20


class CorruptSnapshot(OSError):
    """A stored snapshot file is missing, truncated or altered: ``snapshot_id`` and ``file``
    say which (``snapshot_id`` None when the caller does not know it)."""

    def __init__(self, message: str, snapshot_id: "int | None" = None, file: str = "") -> None:
        super().__init__(message)
        self.snapshot_id, self.file = snapshot_id, file

    def __reduce__(self):
        return (CorruptSnapshot, (str(self), self.snapshot_id, self.file))


def crc(data: bytes) -> list:
    """``[size, CRC-32]`` of ``data``. O(bytes)."""
    return [len(data), zlib.crc32(data)]


def file_crc(path: "str | os.PathLike") -> list:
    """``[size, CRC-32]`` of a local file, read in 1 MiB chunks. O(bytes)."""
    value, size = 0, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            value, size = zlib.crc32(chunk, value), size + len(chunk)
    return [size, value]


def dir_sums(directory: "str | os.PathLike", known: "dict | None" = None) -> dict:
    """``{relative path: [size, CRC-32]}`` of every file under ``directory`` but the sums file.

    ``known``: the caller's record of files summed before, by inode, size and modification
    time, updated here to this directory's files. A RocksDB checkpoint hard-links the table
    files it shares with the one before, which never change: each base summed every byte of
    the database, now only its new files.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.sst").write_bytes(b"rows")
    >>> known = {}; dir_sums(d, known) == dir_sums(d) and len(known)
    1
    >>> e = pathlib.Path(tempfile.mkdtemp()); (e / "a.sst").hardlink_to(d / "a.sst")
    >>> _ = (e / "b.sst").write_bytes(b"more"); sorted(dir_sums(e, known)), len(known)   # a.sst read from known
    (['a.sst', 'b.sst'], 2)
    """
    root = Path(directory)
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != DIR_SUMS]
    if known is None:
        return {str(p.relative_to(root)): file_crc(p) for p in files}
    sums, seen = {}, {}
    for p in files:
        st = p.stat()
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        value = seen[ident] = known.get(ident) or file_crc(p)
        sums[str(p.relative_to(root))] = value
    known.clear()
    known.update(seen)  # only this directory's: the files the next checkpoint may share
    return sums


def check_dir(directory: "str | os.PathLike", sums: dict, where: str, snapshot_id: "int | None" = None) -> None:
    """CorruptSnapshot unless every file of ``sums`` is under ``directory`` with its size and CRC."""
    root = Path(directory)
    for name, expected in sums.items():
        path = root / name
        if not path.is_file():
            raise CorruptSnapshot(f"{where}: {name} is missing", snapshot_id, name)
        check(file_crc(path), expected, f"{where}: {name}", snapshot_id, name)


def check(got: list, expected: list, what: str, snapshot_id: "int | None" = None, name: str = "") -> None:
    """CorruptSnapshot unless ``got`` (``[size, CRC]``) is ``expected``."""
    if list(got) == list(expected):
        return
    if got[0] != expected[0]:
        detail = f"{got[0]:,} bytes where {expected[0]:,} were written"
    else:
        detail = f"CRC-32 {got[1]:08x} where {expected[1]:08x} was written"
    raise CorruptSnapshot(f"{what} differs from what was written ({detail})", snapshot_id, name)
