"""A stage instance's side of snapshots: RocksDB backends, checkpoints, uploads, restore.

On ``snapshot(T)`` (delivered with watermark T, after the keyed state folded
everything below T into RocksDB) the instance takes a RocksDB checkpoint of
each stateful step (hard links: milliseconds, in the event loop), notes where
its source partitions must replay from, and uploads the checkpoints to the
snapshot store in a background thread. Processing never waits for the upload;
``prepared(id)`` answers once it is durable.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.store import SnapshotStore


class StageSnapshots:
    """Backends and snapshot duties of one stage instance.

    ``restore``: ``{"snapshot": id, "states": {step name: participant}, "sources": {...}}``
    from the manifest being recovered, or empty for a fresh start.
    """

    def __init__(self, store_uri: Optional[str], participant_prefix: str, restore: dict) -> None:
        self.store = SnapshotStore(store_uri) if store_uri else None
        self.prefix = participant_prefix
        self.restore = restore
        self.workdir = None
        if store_uri:
            # A killed incarnation of this instance could not clean up after itself.
            for stale in Path(tempfile.gettempdir()).glob(f"driftstream-{participant_prefix}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            self.workdir = Path(tempfile.mkdtemp(prefix=f"driftstream-{participant_prefix}-"))
        self.backends: dict = {}
        self.pending: dict = {}

    def participant(self, step_name: str) -> str:
        return f"{self.prefix}-{step_name}"

    def backend(self, step_name: str) -> RocksDBBackend:
        """The RocksDB backend of a stateful step: restored from the snapshot if there is one."""
        path = self.workdir / f"db-{step_name}"
        participant = self.restore.get("states", {}).get(step_name)
        if participant is not None:
            self.store.download(self.restore["snapshot"], participant, path)
        backend = self.backends[step_name] = RocksDBBackend(path)
        return backend

    def take(self, snapshot_id: int, t: tuple, reader: Any) -> None:
        """Checkpoint now, upload in the background; see :meth:`prepared`."""
        if self.store is None:
            return
        checkpoints = {}
        for step_name, backend in self.backends.items():
            checkpoints[step_name] = backend.checkpoint(self.workdir / f"ckpt-{snapshot_id}-{step_name}")
        sources = reader.resume_positions(t) if reader is not None else {}
        loop = asyncio.get_running_loop()
        self.pending[snapshot_id] = loop.run_in_executor(None, self._upload, snapshot_id, checkpoints, sources)

    def _upload(self, snapshot_id: int, checkpoints: dict, sources: dict) -> dict:
        states = {}
        for step_name, local in checkpoints.items():
            participant = self.participant(step_name)
            self.store.upload(snapshot_id, participant, local)
            shutil.rmtree(local, ignore_errors=True)
            states[step_name] = participant
        return {"states": states, "sources": {str(p): list(pos) for p, pos in sources.items()}}

    async def prepared(self, snapshot_id: int) -> dict:
        for _ in range(1000):
            if snapshot_id in self.pending:
                return await self.pending.pop(snapshot_id)
            await asyncio.sleep(0.002)  # the marker may still be on its way from the acker
        raise TimeoutError(f"{self.prefix} never received snapshot {snapshot_id}")

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
