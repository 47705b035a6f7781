"""A stage instance's side of snapshots: RocksDB backends, checkpoints, uploads, restore.

On ``snapshot(T)`` (delivered with watermark T, after the keyed state folded
everything below T into its base states) the instance takes, in the event loop,
only what changed since the last snapshot (references to immutable states:
O(changed keys), no encoding) and where its source partitions must replay from.
One background thread per instance then, snapshot after snapshot in order,
encodes and writes those states to RocksDB and stores them: as a delta (one
file of the encoded states) on most snapshots, as a base (a RocksDB checkpoint,
hard links, uploaded) every few seconds; see :mod:`driftstream.snapshots.changelog`.
Processing never waits for any of it; the instance's part of the manifest goes
to the acker once the snapshot is durable.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.changelog import DELTA_FILE, Chain, decode_delta, encode_delta
from driftstream.snapshots.state_cache import StateCache
from driftstream.snapshots.store import SnapshotStore


class StageSnapshots:
    """Backends and snapshot duties of one stage instance.

    ``restore``: ``{"states": {step name: chain entry}, "sources": {...}}``
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
            _remove_stale_workdirs(participant_prefix)
            self.workdir = Path(tempfile.mkdtemp(prefix=f"driftstream-{participant_prefix}-{os.getpid()}-"))
        self.backends: dict = {}
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

    def take(self, snapshot_id: int, t: tuple, reader: Any, prepared: Callable[[dict], None]) -> None:
        """Take the changed states and source positions now; write and store them in the
        background, then call ``prepared(part)`` in the event loop: the manifest's record of
        this instance (``{"states": ..., "sources": ...}``, or ``{"error": message}``)."""
        if self.store is None:
            prepared({"states": {}, "sources": {}})
            return
        batches = {step_name: cache.take_dirty() for step_name, cache in self.backends.items()}
        sources = reader.resume_positions(t) if reader is not None else {}
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._worker, self._persist, snapshot_id, batches, sources)
        future.add_done_callback(lambda f: self._written(f, batches, prepared))

    def _written(self, future: Any, batches: dict, prepared: Callable[[dict], None]) -> None:
        if future.cancelled():
            return  # closed: this incarnation is gone
        error = future.exception()
        if error is not None:
            prepared({"error": f"{type(error).__name__}: {error}"})
            return
        for step_name, batch in batches.items():
            self.backends[step_name].mark_written(batch)
        prepared(future.result())

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

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
        for backend in self.backends.values():
            backend.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _remove_stale_workdirs(participant_prefix: str) -> None:
    """Delete the working directories that earlier incarnations of this instance left behind.

    A killed process cannot clean up after itself. Only directories of processes that
    are gone (or of this one: a reset incarnation) are deleted: for a moment after a
    recovery two incarnations may both be alive, and the older one's open database
    must not vanish under it.
    """
    for stale in Path(tempfile.gettempdir()).glob(f"driftstream-{participant_prefix}-*"):
        # <pid>-<mkdtemp's 8 characters>; anything else is another instance whose prefix
        # extends this one ("...-1" and "...-12-<pid>-...").
        match = re.fullmatch(r"(\d+)-[a-z0-9_]{8}", stale.name[len(f"driftstream-{participant_prefix}-") :])
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or not _alive(pid):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
