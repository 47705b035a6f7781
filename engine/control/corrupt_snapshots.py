"""Corrupt snapshots: a restore that finds a stored file damaged falls back to the snapshot before.

A restoring instance checks every file it reads against the checksums written with
it (:mod:`driftstream.snapshots.checksums`) and fails with ``CorruptSnapshot``. The
launch then takes the snapshot it restored out of use (its manifest renamed
``MANIFEST.corrupt.json``, the file named beside it in ``CORRUPT.txt``), and the one
the damaged file belongs to if that is another, and starts again from the newest
committed snapshot left that is not built on the damaged file's snapshot (the store
keeps one before each base of the newest chain, see ``SnapshotStore.prune``; a manifest
altered after its commit is skipped by the store itself): older input is replayed, and under exactly-once the sinks
drop what they already hold. ``status()["corrupt_snapshots"]`` lists what was set
aside. With none left, the run fails with the file and what to do.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import ray

from driftstream.snapshots.checksums import CorruptSnapshot
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.control.snapshot_committer import SnapshotCommitter

log = logging.getLogger(__name__)


def corrupt_cause(exc: BaseException) -> Optional[CorruptSnapshot]:
    """The CorruptSnapshot behind an actor call's failure, if that is what it was."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return cause if isinstance(cause, CorruptSnapshot) else None


class CorruptSnapshots:
    """What a run set aside, and the fallback to the snapshot before."""

    def __init__(self, committer: SnapshotCommitter) -> None:
        self.committer = committer
        self.records: list = []

    def fall_back(self, restored: Manifest, corrupt: CorruptSnapshot) -> Manifest:
        """Set ``restored`` (and the damaged file's snapshot) aside; the newest committed
        manifest left not built on the damaged file's snapshot, or FlowError naming the file
        when there is none."""
        store = self.committer.store
        reason = f"{corrupt} (found restoring snapshot {restored.snapshot_id})"
        for sid in dict.fromkeys(s for s in (restored.snapshot_id, corrupt.snapshot_id) if s is not None):
            store.quarantine(sid, reason)
        self.records.append({"snapshot": restored.snapshot_id, "file": corrupt.file, "error": str(corrupt), "at": time.time()})
        older = self._newest_without(corrupt.snapshot_id)
        if older is None:
            raise FlowError(f"{corrupt}; no older committed snapshot is left in {store.uri} to restore instead: restore the "
                            "file from a backup (then rename MANIFEST.corrupt.json back to MANIFEST.json), or start with "
                            "fresh=True to discard the flow's state")
        log.warning("flow %s: %s; restoring snapshot %d instead", self.committer.plan.flow_name, reason, older.snapshot_id)
        return older

    def _newest_without(self, damaged: Optional[int]) -> Optional[Manifest]:
        """The newest usable committed manifest that requires no file of snapshot ``damaged``
        (None: any). Those passed by stay committed: the damaged file may be another
        participant's than theirs, and a restore that does meet it falls back again."""
        store = self.committer.store
        passed = []
        for sid in reversed(store.committed_ids()):
            data = store.read_manifest(sid)  # None: not usable (the store said why)
            if data is None:
                continue
            manifest = Manifest.from_json(data)
            if damaged is not None and damaged in manifest.requires:
                passed.append(sid)
                continue
            if passed:
                log.warning("flow %s: passing by snapshots %s, built on files of the damaged snapshot %d",
                            self.committer.plan.flow_name, passed, damaged)
            return manifest
        return None
