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

import logging
import os
import uuid
from typing import Callable, Optional

from driftstream.snapshots.checksums import CorruptSnapshot
from driftstream.snapshots.manifest_text import decode_manifest, encode_manifest, has_checksum, links_in
from driftstream.snapshots.retention import kept_snapshots
from driftstream.snapshots.snapshot_files import (  # noqa: F401 - the layout's names, for the store's callers
    CORRUPT_NOTE, MANIFEST, QUARANTINED, SnapshotFiles, _check_id, _pafs)

log = logging.getLogger(__name__)


class SnapshotStore(SnapshotFiles):
    """Checkpoints and manifests of one job under ``uri``; keeps the newest ``keep`` committed snapshots.

    ``prune_every``: prune after every n-th commit (a listing of the root each time);
    in between, up to n - 1 more old snapshots stay.
    """

    def __init__(self, uri: str, *, keep: int = 2, prune_every: int = 1, pinned: Optional[Callable[[int], bool]] = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        super().__init__(uri)
        self.keep = keep
        #: the newest committed id it holds for is kept too (see retention.kept_snapshots)
        self.pinned = pinned
        self._links: dict = {}  # snapshot id -> what its manifest is built on, links_in (None: unusable)
        self._unchecked_noted = False  # a manifest without a checksum was logged (once)
        self.prune_every = prune_every
        self._committed_since_prune = 0
        self._newest_committed: Optional[int] = None  # known after the first commit (see write_manifest)

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

    def set_aside_unpinned(self, why: str) -> list:
        """Quarantine (with ``why``) the committed snapshots after the newest one ``pinned`` holds
        for, so that the newest committed is that one (none pinned: every committed one goes);
        returns their ids. Without ``pinned``, nothing: every committed snapshot will do. For a
        rollback past snapshots a vote did not certify (issue 58: they may hold a corrupt
        replica's state, or a time the run has not reached again)."""
        if self.pinned is None:
            return []
        committed = self.committed_ids()
        newest = next((sid for sid in reversed(committed) if self.pinned(sid)), None)
        aside = [sid for sid in committed if newest is None or sid > newest]
        for sid in aside:
            self.quarantine(sid, why)
        return aside

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
        _check_id(snapshot_id)
        stored = encode_manifest(manifest, snapshot_id)  # raises before the store is touched
        if self._newest_committed is None:
            # One listing per store object: commits every 50 ms would list the store each time.
            # A store has one writer at a time (the coordinator), so what it committed last stays newest.
            committed = self.committed_ids()
            self._newest_committed = committed[-1] if committed else 0
        if snapshot_id < self._newest_committed:
            raise ValueError(f"snapshot {snapshot_id} is older than the newest committed one, {self._newest_committed}")
        snap = self._snapshot_dir(snapshot_id)
        # Readers only ever open MANIFEST.json: the temporary name (a dot, a random part)
        # is invisible to them, and the move replaces the name in one step (a rename on
        # local disks and HDFS; on object stores the final object appears whole).
        tmp = f"{snap}/.{MANIFEST}.{uuid.uuid4().hex}.tmp"
        self._write(snap, tmp, stored)
        (os.replace if self.is_local else self.fs.move)(tmp, f"{snap}/{MANIFEST}")
        self._links[snapshot_id] = links_in(manifest)
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
        manifest, problem = decode_manifest(data)
        if manifest is not None and not self._unchecked_noted and not has_checksum(data):
            self._unchecked_noted = True
            log.info("snapshot store %s: manifest %s has no checksum (written before manifests had one): read unchecked", self.uri, path)
        return manifest, problem, path

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
        whoever looks into the damage; and the newest for which ``pinned`` holds.

        Cost: one listing, plus reading each committed manifest once per store object, plus
        one existence check per snapshot deleted.
        """
        committed = self.committed_ids()
        if len(committed) <= self.keep:
            return []
        usable = [sid for sid in committed if self._links_of(sid) is not None]  # ascending
        kept, required = kept_snapshots(usable, self._links_of, self.keep, self.pinned)
        if not kept:
            return []
        oldest_kept = usable[-self.keep]
        for snapshot_id in committed:
            if snapshot_id < oldest_kept and snapshot_id not in kept and snapshot_id in required:
                self._retire(snapshot_id)
        doomed = [i for i in self.snapshot_ids() if i < oldest_kept and i not in kept and i not in required
                  and self.fs.get_file_info(f"{self._snapshot_dir(i)}/{QUARANTINED}").type != _pafs().FileType.File]
        for snapshot_id in doomed:
            self.delete_snapshot(snapshot_id)
        return doomed

    def _links_of(self, snapshot_id: int) -> Optional[tuple]:
        """``(requires, bases)`` of the manifest of ``snapshot_id`` (``manifest_text.links_in``); None if it is not usable."""
        # Manifests never change once committed, so each is read once.
        if snapshot_id not in self._links:
            manifest = self.read_manifest(snapshot_id)
            self._links[snapshot_id] = None if manifest is None else links_in(manifest)
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

    def __repr__(self) -> str:
        return f"SnapshotStore({self.uri!r}, keep={self.keep})"


class NoUsableManifest(CorruptSnapshot):
    """Every committed manifest of a store is unusable (altered or torn): nothing to restore."""

    def __reduce__(self):
        return (NoUsableManifest, (str(self), self.snapshot_id, self.file))
