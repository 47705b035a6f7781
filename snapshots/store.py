"""The snapshot store: checkpoint directories and manifests under one URI.

Any filesystem ``pyarrow.fs`` understands works the same way: a local directory
(a plain path or ``file://``, the default), ``s3://``, ``hdfs://``, ``gs://``.
Layout::

    <root>/<snapshot_id>/<participant>/...   one participant's checkpoint files, or its DELTA
    <root>/<snapshot_id>/MANIFEST.json       present only once the snapshot is committed

A snapshot exists for recovery only once its manifest does. Participants upload
first, the coordinator commits the manifest last — written under a temporary name
and then moved into place, so a reader never sees half a manifest — and then the
snapshots older than the newest ``keep`` committed ones are deleted.

>>> import tempfile, os, pathlib, json
>>> tmp = tempfile.mkdtemp()
>>> cp = pathlib.Path(tmp, "cp"); cp.mkdir(); _ = (cp / "data.sst").write_bytes(b"rows")
>>> store = SnapshotStore(os.path.join(tmp, "store"))
>>> store.read_latest_manifest() is None
True
>>> _ = store.upload(1, "count-0", cp)
>>> store.write_manifest(1, {"time": [5, 0, 0, 5], "participants": ["count-0"]})
>>> store.read_latest_manifest()
{'participants': ['count-0'], 'snapshot_id': 1, 'time': [5, 0, 0, 5]}
>>> json.loads(open(os.path.join(tmp, "store", "0000000001", "MANIFEST.json")).read())["checksum"][:7]
'sha256:'
>>> sorted(os.listdir(store.download(1, "count-0", os.path.join(tmp, "restored"))))
['data.sst']
>>> import shutil; shutil.rmtree(tmp)

A manifest may list in ``"requires"`` older snapshots whose files it is built on
(see :mod:`.changelog`), and in ``"bases"`` which of those are its participants' bases;
pruning keeps the files required, and beside the newest ``keep`` manifests an older one
built on none of the newest's files (an older base), so that one damaged base still
leaves a snapshot to restore (see :meth:`SnapshotStore.prune`).
Manifests are JSON, never pickle, and carry the SHA-256 of their canonical JSON
(``"checksum"``): a manifest altered after its commit, even into valid JSON, is skipped
with a WARNING naming the file, as one that does not parse is, and the one before it used.
Costs: ``upload`` to a local store hard-links the files (O(files)), to any other
filesystem it copies their bytes; ``download`` copies the bytes of one checkpoint; ``read_latest_manifest`` and ``prune`` list the root
(one listing, plus one existence check per snapshot directory on object stores).
Local stores are not fsync'ed: a committed manifest survives a process crash,
not necessarily a power cut (a manifest that no longer parses is skipped, and
the one before it used, which is why ``keep`` is at least 2 by default).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import uuid
from pathlib import Path
from typing import Any, Optional, Union

from functools import cache

from driftstream.snapshots.checksums import DIR_SUMS, FILE_SUM, CorruptSnapshot, check, check_dir, crc, dir_sums

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
QUARANTINED = "MANIFEST.corrupt.json"  # a committed manifest whose files turned out corrupt
CORRUPT_NOTE = "CORRUPT.txt"
#: A manifest's field holding ``sha256:<hex>`` of its canonical JSON without this field.
CHECKSUM = "checksum"
_PARTICIPANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*\Z")  # one path segment; '.' and '_' prefixes are ours
_ID_DIGITS = 10  # zero-padded directory names, so a listing sorts like the ids (ids may outgrow it)

PathLike = Union[str, "os.PathLike[str]"]


@cache
def _pafs() -> Any:
    """``pyarrow.fs``, imported when a store first needs it: every actor process imports this
    module, and pyarrow (with numpy) costs ~0.1 s of an actor's start."""
    import pyarrow.fs

    return pyarrow.fs


class SnapshotStore:
    """Checkpoints and manifests of one job under ``uri``; keeps the newest ``keep`` committed snapshots.

    ``prune_every``: prune after every n-th commit (a listing of the root each time);
    in between, up to n - 1 more old snapshots stay.
    """

    def __init__(self, uri: str, *, keep: int = 2, prune_every: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.uri = uri
        self.keep = keep
        # A plain path (even relative) is a local directory, opened when first needed: an
        # actor's start then imports no pyarrow (its deltas are written with os calls).
        self._fs: Any = None
        if "://" in uri:
            self._fs, root = _pafs().FileSystem.from_uri(uri)
            self.root = root.rstrip("/")
        else:
            self.root = os.path.abspath(uri).rstrip("/")
        self._links: dict = {}  # snapshot id -> what its manifest is built on, _links_in (None: unusable)
        self._unchecked_noted = False  # a manifest without a checksum was logged (once)
        self.prune_every = prune_every
        self._committed_since_prune = 0
        self._newest_committed: Optional[int] = None  # known after the first commit (see write_manifest)

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
        sums = json.dumps(dir_sums(src)).encode()
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

    def quarantine(self, snapshot_id: int, reason: str) -> None:
        """Take a committed snapshot out of use (a file of it is corrupt): its manifest is
        renamed ``MANIFEST.corrupt.json``, with ``reason``, and kept for whoever looks."""
        snap = self._snapshot_dir(snapshot_id)
        manifest = f"{snap}/{MANIFEST}"
        if self.fs.get_file_info(manifest).type != _pafs().FileType.File:
            return
        self._write(snap, f"{snap}/{CORRUPT_NOTE}", reason.encode())
        (os.replace if self.is_local else self.fs.move)(manifest, f"{snap}/{QUARANTINED}")
        self._links.pop(snapshot_id, None)
        self._newest_committed = None  # list again at the next commit

    # -- manifests ----------------------------------------------------------------------

    def write_manifest(self, snapshot_id: int, manifest: dict) -> None:
        """Commit snapshot ``snapshot_id``: write its manifest atomically, then prune old snapshots.

        The manifest is stored as JSON with ``"snapshot_id"`` added (a manifest that
        already has one must agree) and ``"checksum"``, the SHA-256 of the rest as canonical
        JSON (sorted keys), the store's own field (a manifest that has one is refused).
        It must survive JSON unchanged — str keys, lists not tuples, no NaN — so that what
        recovery reads is what was written; anything else raises ValueError/TypeError before
        the store is touched. Ids must not go backwards: committing an id below the newest
        committed one raises ValueError (re-committing the same id replaces its manifest).
        """
        if not isinstance(manifest, dict):
            raise TypeError(f"a manifest is a dict, not {type(manifest).__name__}")
        _check_id(snapshot_id)
        if manifest.get("snapshot_id", snapshot_id) != snapshot_id:
            raise ValueError(f"manifest says snapshot_id={manifest['snapshot_id']!r}, committed as {snapshot_id}")
        if CHECKSUM in manifest:
            raise ValueError(f"{CHECKSUM!r} is the store's own field of a manifest (the SHA-256 it writes): leave it out")
        manifest = {**manifest, "snapshot_id": snapshot_id}
        # One line: with ``indent`` json falls back to its pure-Python encoder, ~0.7 ms a commit.
        text = json.dumps(manifest, sort_keys=True)
        if json.loads(text) != manifest:
            raise ValueError("the manifest does not survive JSON unchanged (tuples, non-str keys or NaN?)")
        if self._newest_committed is None:
            # One listing per store object: commits every 50 ms would list the store each time.
            # A store has one writer at a time (the coordinator), so what it committed last stays newest.
            committed = self.committed_ids()
            self._newest_committed = committed[-1] if committed else 0
        if snapshot_id < self._newest_committed:
            raise ValueError(f"snapshot {snapshot_id} is older than the newest committed one, {self._newest_committed}")
        snap = self._snapshot_dir(snapshot_id)
        # The checksum goes last, spliced in rather than encoded again: a reader drops it and
        # re-encodes the rest with sorted keys, which gives ``text`` back.
        stored = f'{text[:-1]}, "{CHECKSUM}": "{_digest(text)}"}}'
        # Readers only ever open MANIFEST.json: the temporary name (a dot, a random part)
        # is invisible to them, and the move replaces the name in one step (a rename on
        # local disks and HDFS; on object stores the final object appears whole).
        tmp = f"{snap}/.{MANIFEST}.{uuid.uuid4().hex}.tmp"
        self._write(snap, tmp, stored.encode("utf-8"))
        (os.replace if self.is_local else self.fs.move)(tmp, f"{snap}/{MANIFEST}")
        self._links[snapshot_id] = _links_in(manifest)
        self._newest_committed = snapshot_id
        self._committed_since_prune += 1
        if self._committed_since_prune >= self.prune_every:
            try:
                self.prune()
                self._committed_since_prune = 0
            except OSError:
                pass  # the snapshot is committed; old ones are pruned at a later commit

    def read_manifest(self, snapshot_id: int) -> Optional[dict]:
        """The committed manifest of ``snapshot_id`` (without its checksum), or None if it is
        not committed, or unusable: it does not parse, or does not match its checksum (a
        WARNING names the file). A manifest from before checksums is read unchecked."""
        manifest, problem, path = self._checked(snapshot_id)
        if problem is not None:
            log.warning("snapshot store %s: manifest %s %s; ignoring that snapshot", self.uri, path, problem)
        return manifest

    def _checked(self, snapshot_id: int) -> tuple:
        """``(manifest, problem, path)``: the manifest, or None with what is wrong with it (a
        problem of None with no manifest: not committed)."""
        path = f"{self._snapshot_dir(snapshot_id)}/{MANIFEST}"
        # Ask first rather than catch: object stores do not all report a missing key as FileNotFoundError.
        if self.fs.get_file_info(path).type != _pafs().FileType.File:
            return None, None, path
        with self.fs.open_input_stream(path) as f:
            data = f.read()
        try:
            manifest = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None, "does not parse", path
        if not isinstance(manifest, dict):
            return None, "is not a JSON object", path
        expected = manifest.pop(CHECKSUM, None)
        if expected is None:
            if not self._unchecked_noted:
                self._unchecked_noted = True
                log.info("snapshot store %s: manifest %s has no checksum (written before manifests had one): read unchecked",
                         self.uri, path)
            return manifest, None, path
        got = _digest(json.dumps(manifest, sort_keys=True))
        if got != expected:
            return None, f"does not match its checksum ({got} where {expected!r} was written: it was changed after its commit)", path
        return manifest, None, path

    def read_latest_manifest(self) -> Optional[dict]:
        """The manifest of the newest committed snapshot that can be used, or None when
        nothing is committed.

        Temporary (half-written) manifests are never read; a committed one that does not
        parse or match its checksum is skipped (a WARNING names it) in favour of the one
        before it. If every committed manifest is so, :class:`NoUsableManifest` says which:
        a flow's state is never dropped silently.
        """
        unusable = []
        for snapshot_id in reversed(self.committed_ids()):
            manifest, problem, path = self._checked(snapshot_id)
            if manifest is not None:
                return manifest
            if problem is not None:
                log.warning("snapshot store %s: manifest %s %s; ignoring that snapshot", self.uri, path, problem)
                unusable.append(f"{path} {problem}")
        if unusable:
            raise NoUsableManifest(
                f"snapshot store {self.uri}: no committed manifest can be used ({'; '.join(unusable)}); nothing is restored "
                f"rather than the state dropped silently: put back an intact MANIFEST.json (from a backup), or move {self.uri} "
                "aside to start from the beginning", None, unusable[0].split(" ", 1)[0])
        return None

    # -- listing and retention ------------------------------------------------------------

    def snapshot_ids(self) -> list:
        """Ids of every snapshot directory, committed or not, ascending. One listing of the root."""
        infos = self.fs.get_file_info(_pafs().FileSelector(self.root, allow_not_found=True))
        return sorted(int(i.base_name) for i in infos if i.type == _pafs().FileType.Directory and i.base_name.isdigit())

    def committed_ids(self) -> list:
        """Ids of the snapshots that have a manifest, ascending."""
        ids = self.snapshot_ids()
        if not ids:
            return []
        infos = self.fs.get_file_info([f"{self._snapshot_dir(i)}/{MANIFEST}" for i in ids])
        return [i for i, info in zip(ids, infos) if info.type == _pafs().FileType.File]

    def prune(self) -> list:
        """Delete the snapshots no kept manifest needs; return the deleted ids.

        Kept: the newest ``keep`` usable manifests and, for each base the newest is built on
        (its manifest's ``"bases"``), the newest usable manifest before that base. The one
        before the oldest base shares no file with the newest: one damaged base or delta of
        the newest chain still leaves a snapshot to fall back to, whenever an older base has
        existed (participants take bases at different snapshots, so the others become that
        one as they move on). Kept too: every snapshot a kept manifest lists in ``"requires"``
        (its files are a base or a delta that a kept snapshot is built on); those older than
        the newest ``keep`` lose their manifest (not a snapshot to restore any more: files it
        needs may be gone; its own stay). Uncommitted snapshots newer than the newest ``keep``
        are kept: they may be in progress; so are quarantined ones (:meth:`quarantine`), for
        whoever looks into the damage.

        Cost: one listing, plus reading each committed manifest once per store object, plus
        one existence check per snapshot deleted.
        """
        committed = self.committed_ids()
        if len(committed) <= self.keep:
            return []
        usable = [sid for sid in committed if self._links_of(sid) is not None]  # ascending
        window = usable[-self.keep :]
        if len(window) < self.keep:
            return []
        newest, oldest_kept = window[-1], window[0]
        requires, bases = self._links_of(newest)
        kept = set(window)
        # For each base the newest is built on, the newest manifest before it: the one before
        # the oldest base is independent of the newest now, the others will be once the
        # participants on older bases take new ones. Without "bases" any required snapshot may be one.
        for base in (bases if bases is not None else {*requires, newest}):
            below = bisect.bisect_left(usable, base)
            if below:
                kept.add(usable[below - 1])
        required = {i for sid in kept for i in self._links_of(sid)[0]}
        for snapshot_id in committed:
            if snapshot_id < oldest_kept and snapshot_id not in kept and snapshot_id in required:
                self._retire(snapshot_id)
        doomed = [i for i in self.snapshot_ids() if i < oldest_kept and i not in kept and i not in required
                  and self.fs.get_file_info(f"{self._snapshot_dir(i)}/{QUARANTINED}").type != _pafs().FileType.File]
        for snapshot_id in doomed:
            self.delete_snapshot(snapshot_id)
        return doomed

    def _links_of(self, snapshot_id: int) -> Optional[tuple]:
        """``(requires, bases)`` of the manifest of ``snapshot_id`` (:func:`_links_in`); None if it is not usable."""
        # Manifests never change once committed, so each is read once.
        if snapshot_id not in self._links:
            manifest = self.read_manifest(snapshot_id)
            self._links[snapshot_id] = None if manifest is None else _links_in(manifest)
        return self._links[snapshot_id]

    def requires(self, snapshot_id: int) -> Optional[list]:
        """The snapshots whose files the committed manifest of ``snapshot_id`` is built on;
        None if it has no usable manifest."""
        links = self._links_of(snapshot_id)
        return None if links is None else links[0]

    def _retire(self, snapshot_id: int) -> None:
        """Delete a manifest whose files stay (a kept manifest is built on them): past
        retention it is no snapshot to restore, and its own older files may be gone."""
        manifest = f"{self._snapshot_dir(snapshot_id)}/{MANIFEST}"
        if self.fs.get_file_info(manifest).type == _pafs().FileType.File:
            self.fs.delete_file(manifest)
        self._links.pop(snapshot_id, None)

    def delete_snapshot(self, snapshot_id: int) -> None:
        """Delete one snapshot: its manifest first, so a half-deleted snapshot is never taken for committed."""
        snap = self._snapshot_dir(snapshot_id)
        manifest = f"{snap}/{MANIFEST}"
        if self.fs.get_file_info(manifest).type == _pafs().FileType.File:
            self.fs.delete_file(manifest)
        if self.fs.get_file_info(snap).type != _pafs().FileType.NotFound:
            self.fs.delete_dir(snap)
        self._links.pop(snapshot_id, None)
        if self._newest_committed is not None and snapshot_id >= self._newest_committed:
            self._newest_committed = None  # list again at the next commit

    # -- paths --------------------------------------------------------------------------------

    def _snapshot_dir(self, snapshot_id: int) -> str:
        _check_id(snapshot_id)
        return f"{self.root}/{snapshot_id:0{_ID_DIGITS}d}"

    def _participant_dir(self, snapshot_id: int, participant: str) -> str:
        participant = _segment("participant name", participant, reserved=(MANIFEST, QUARANTINED, CORRUPT_NOTE))
        return f"{self._snapshot_dir(snapshot_id)}/{participant}"

    def __repr__(self) -> str:
        return f"SnapshotStore({self.uri!r}, keep={self.keep})"


class NoUsableManifest(CorruptSnapshot):
    """Every committed manifest of a store is unusable (altered or torn): nothing to restore."""

    def __reduce__(self):
        return (NoUsableManifest, (str(self), self.snapshot_id, self.file))


def _links_in(manifest: dict) -> tuple:
    """``(requires, bases)``: the older snapshots whose files ``manifest`` is built on, and the
    snapshots of its participants' bases (None when it does not say: written before it did)."""
    bases = manifest.get("bases")
    return [int(i) for i in manifest.get("requires", [])], None if bases is None else [int(i) for i in bases]


def _digest(text: str) -> str:
    """``sha256:<hex>`` of a manifest's canonical JSON. O(its length)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


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
