"""A stage instance's side of snapshots: RocksDB backends, checkpoints, uploads, restore.

On ``snapshot(T)`` (delivered with watermark T, after the keyed state folded
everything below T into its base states) the instance takes, in the event loop,
only what changed since the last snapshot (references to immutable states:
O(changed keys), no encoding) and where its source partitions must replay from.
One background thread per instance then, snapshot after snapshot in order,
encodes and writes those states to RocksDB and stores them: as a delta (one
file of the encoded states) on most snapshots, as a base (a RocksDB checkpoint,
hard links, uploaded) every few seconds; see :mod:`driftstream.snapshots.changelog`.
Processing never waits for any of it; ``prepared(id)`` answers once the
snapshot is durable.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.changelog import DELTA_FILE, Chain, decode_delta, encode_delta
from driftstream.snapshots.state_cache import StateCache
from driftstream.snapshots.store import SnapshotStore


class StageSnapshots:
    """Backends and snapshot duties of one stage instance.

    ``restore``: ``{"snapshot": id, "states": {step name: chain entry}, "sources": {...}}``
    from the manifest being recovered, or empty for a fresh start. ``base_every_s``:
    seconds between full checkpoints (the snapshots in between write deltas).
    """

    def __init__(self, store_uri: Optional[str], participant_prefix: str, restore: dict, base_every_s: float = 5.0) -> None:
        self.store = SnapshotStore(store_uri) if store_uri else None
        self.prefix = participant_prefix
        self.restore = restore
        self.base_every_s = base_every_s
        self.chains: dict = {}  # step name -> Chain
        self.workdir = None
        if store_uri:
            # A killed incarnation of this instance could not clean up after itself.
            for stale in Path(tempfile.gettempdir()).glob(f"driftstream-{participant_prefix}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            self.workdir = Path(tempfile.mkdtemp(prefix=f"driftstream-{participant_prefix}-"))
        self.backends: dict = {}
        self.pending: dict = {}
        # One thread: snapshot k's writes must land before snapshot k+1's checkpoint.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot") if store_uri else None

    def participant(self, step_name: str) -> str:
        return f"{self.prefix}-{step_name}"

    def backend(self, step_name: str) -> StateCache:
        """The base states of a stateful step (RocksDB behind a write-back cache),
        restored from the snapshot if there is one."""
        path = self.workdir / f"db-{step_name}"
        entry = self.restore.get("states", {}).get(step_name)
        participant = self.participant(step_name)
        if entry is None:
            self.chains[step_name] = Chain(self.base_every_s)
            db = RocksDBBackend(path)
        else:
            self.store.download(entry["base"], participant, path)
            db = RocksDBBackend(path)
            for delta in entry["deltas"]:
                db.put_encoded(decode_delta(self.store.get_file(delta, participant, DELTA_FILE)))
            # Go on from the restored chain: its files stay in the store while a manifest needs them.
            self.chains[step_name] = Chain.from_entry(entry, time.time(), self.base_every_s)
        backend = self.backends[step_name] = StateCache(db)
        return backend

    def take(self, snapshot_id: int, t: tuple, reader: Any) -> None:
        """Take the changed states and source positions now; write, checkpoint and upload in
        the background; see :meth:`prepared`."""
        if self.store is None:
            return
        batches = {step_name: cache.take_dirty() for step_name, cache in self.backends.items()}
        sources = reader.resume_positions(t) if reader is not None else {}
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._worker, self._persist, snapshot_id, batches, sources)
        future.add_done_callback(lambda f: self._written(f, batches))
        self.pending[snapshot_id] = future

    def _written(self, future: Any, batches: dict) -> None:
        if not future.cancelled() and future.exception() is None:
            for step_name, batch in batches.items():
                self.backends[step_name].mark_written(batch)

    def _persist(self, snapshot_id: int, batches: dict, sources: dict) -> dict:
        states = {}
        now = time.time()
        for step_name, batch in batches.items():
            cache, chain, participant = self.backends[step_name], self.chains[step_name], self.participant(step_name)
            pairs = cache.write(batch)
            if chain.needs_base(now):
                local = cache.checkpoint(self.workdir / f"ckpt-{snapshot_id}-{step_name}")
                self.store.upload(snapshot_id, participant, local)
                shutil.rmtree(local, ignore_errors=True)
                chain.add_base(snapshot_id, now)
            elif pairs:  # nothing changed: the chain as it is describes this snapshot too
                self.store.put_file(snapshot_id, participant, DELTA_FILE, encode_delta(pairs))
                chain.add_delta(snapshot_id)
            states[step_name] = chain.entry(participant)
        return {"states": states, "sources": {str(p): list(pos) for p, pos in sources.items()}}

    async def prepared(self, snapshot_id: int) -> dict:
        for _ in range(1000):
            if snapshot_id in self.pending:
                return await self.pending.pop(snapshot_id)
            await asyncio.sleep(0.002)  # the marker may still be on its way from the acker
        raise TimeoutError(f"{self.prefix} never received snapshot {snapshot_id}")

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
        for backend in self.backends.values():
            backend.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
