"""A stage instance's side of snapshots: RocksDB backends, checkpoints, uploads, restore.

On ``snapshot(T)`` (delivered with watermark T, after the keyed state folded
everything below T into its settled states) the instance takes, in the event loop,
what changed (references to immutable states and inputs: O(changed keys), no
encoding) and where its source partitions must replay from, and decides whether
the snapshot is a delta or a base. A delta is one file of the changed keys'
folded inputs (or states): a small one (a short interval's, about a millisecond
of work) is written at once. A larger delta, and a base every few seconds (the
states changed since the last base written to RocksDB, then a checkpoint), are
written by a task of the event loop, snapshot after snapshot in order, a slice
of about a millisecond at a time with the loop's other callbacks in between (in a
busy loop, as long as the owner's last callback took: ``slice_s``). A snapshot with more
changed keys than a delta should hold (``MAX_DELTA_KEYS``) writes a base instead.
Only a remote store's uploads go to a thread. See
:mod:`driftstream.snapshots.changelog`. Processing never waits for more than a
slice; the instance's part of the manifest goes to the acker once the snapshot
is durable.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, NamedTuple, Optional

from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.changelog import DELTA_FILE, REMOVED, Chain, delta_row, delta_rows, pack_delta, replay_deltas
from driftstream.snapshots.codec import encode
from driftstream.snapshots.memory_size import node_budget_bytes
from driftstream.snapshots.slices import restore_slices
from driftstream.snapshots.state_cache import StateCache
from driftstream.snapshots.state_keys import StateKeys
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.manifest import SnapshotPart, slices_of


#: Deltas of at most this many changed keys are written at once, in the callback that takes them (see ``take``).
INLINE_DELTA_KEYS = 256

#: Seconds of snapshot writing between two turns of the event loop's other callbacks.
SLICE_S = 0.001

#: A base's states go to RocksDB this many to a write (one WriteBatch: ~1 ms of small states, a slice).
WRITE_CHUNK = 128

#: A base waits for RocksDB to flush its writes at most this long, polling this often.
FLUSH_WAIT_S, FLUSH_POLL_S = 5.0, 0.002


class StageSnapshots:
    """Backends and snapshot duties of one stage instance.

    ``restore``: this instance's part of the manifest being recovered (None: a fresh
    start). ``base_every_s``: seconds between full checkpoints (the snapshots in between
    write deltas). ``deferred``: snapshots are written only when the owner calls
    :meth:`write_next` (the simulator: a seeded scheduling decision), never by a task.
    ``scratch``: where the working databases live (default: the system's temporary
    directory; the simulator gives each run its own). ``cache_bytes``: the memory
    budget of each stateful step's cache.
    """

    def __init__(
        self,
        store_uri: Optional[str],
        participant_prefix: str,
        restore: Optional[SnapshotPart] = None,
        base_every_s: float = 5.0,
        deferred: bool = False,
        scratch: Optional[str] = None,
        cache_bytes: Optional[int] = None,
    ) -> None:
        self.store = SnapshotStore(store_uri) if store_uri else None
        self.prefix = participant_prefix
        self.restore = restore or SnapshotPart()
        self.base_every_s = base_every_s
        self.deferred = deferred
        self.cache_bytes = node_budget_bytes() if cache_bytes is None else cache_bytes  # the node's, where it runs
        # Seconds of writing per turn of the event loop; the owner raises it to what its own
        # callbacks take when it is busy (a backlog), so that snapshots get a fair share.
        self.slice_s = SLICE_S
        self.chains: dict = {}  # step name -> Chain
        self.scratch = scratch or tempfile.gettempdir()
        self.workdir: Optional[Path] = None  # made with the first backend
        self.backends: dict = {}
        self.restore_s = 0.0  # seconds spent restoring backends from the snapshot
        # Steps whose last write failed: their deltas since build on a hole until the next base
        # (the writer's own record; the chain is reset when the failure is reported).
        self._broken: set = set()
        # Snapshots waiting for the writer, oldest first: (id, jobs, part, prepared).
        # One writer: snapshot k's writes must land before snapshot k+1's checkpoint.
        self._queue: deque = deque()
        self._writer: Optional[asyncio.Task] = None
        # A remote store's uploads only: they wait on the network, not on the interpreter.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-io") if self.store and not self.store.is_local else None

    def participant(self, step_name: str) -> str:
        return f"{self.prefix}-{step_name}"

    def backend(self, step_name: str, fn: Callable[[Any, Any], tuple], entries: bool = False,
                keys: Optional[StateKeys] = None) -> Optional[StateCache]:
        """The settled states of a stateful step (RocksDB behind a write-back cache within the
        memory budget), restored from the snapshot if there is one. ``fn`` is the step's
        function: deltas that hold inputs are re-applied with it. ``keys``: how its state keys
        are stored (their key groups).

        Without a store (no snapshots), a step of entries (``entries``) still gets one, so
        its memory stays within the budget; a step whose state is a value gets None (the
        keyed state keeps its states in a dict).

        A part that is one participant's whole chain (the same parallelism) downloads its base
        as the database and goes on with its chain; slices of several (another parallelism,
        :mod:`driftstream.snapshots.slices`) are copied range by range into a new database,
        whose first snapshot is then a base."""
        if self.store is None and not entries:
            return None
        if self.workdir is None:
            # A killed incarnation of this instance could not clean up after itself.
            _remove_stale_workdirs(self.scratch, self.prefix)
            self.workdir = Path(tempfile.mkdtemp(prefix=f"driftstream-{self.prefix}-{os.getpid()}-", dir=self.scratch))
        path = self.workdir / f"db-{step_name}"
        keys = keys or StateKeys()
        state = self.restore.states.get(step_name)
        slices = [] if state is None else slices_of(state)
        started = time.perf_counter()
        if not slices:
            self.chains[step_name] = Chain(self.base_every_s)
            # fresh: written, not read, until its cache drops a state (RocksDBBackend's bulk mode)
            db = RocksDBBackend(path, keys, bulk=True)
        elif len(slices) == 1 and "groups" not in slices[0] and not slices[0].get("legacy"):
            entry = slices[0]
            self.store.download(entry["base"], entry["participant"], path)
            db = RocksDBBackend(path, keys)
            deltas = [delta_rows(self.store.get_file(d, entry["participant"], DELTA_FILE), keys) for d in entry["deltas"]]
            try:
                states = replay_deltas(deltas, db.get_encoded, fn)
            except Exception as exc:
                raise RuntimeError(f"step {step_name!r}: re-applying the inputs of snapshots {entry['deltas']} failed: {exc!r}") from exc
            db.put_encoded([(k, state if state is REMOVED else encode(state)) for k, state in states.items()])
            # Go on from the restored chain: its files stay in the store while a manifest needs them.
            self.chains[step_name] = Chain.from_entry(entry, time.time(), self.base_every_s)
        else:
            db = RocksDBBackend(path, keys)
            try:
                restore_slices(self.store, slices, db, fn, self.workdir)
            except RuntimeError as exc:
                raise RuntimeError(f"step {step_name!r}: {exc}") from exc
            self.chains[step_name] = Chain(self.base_every_s)  # nothing of this database is in the store yet
        if slices:
            self.restore_s += time.perf_counter() - started
        backend = self.backends[step_name] = StateCache(db, self.cache_bytes, track_changes=self.store is not None)
        return backend

    def over_budget(self) -> bool:
        """True while a stateful step's cache is over its budget, waiting for a base to be
        written (:attr:`StateCache.over_budget`); the owner then lets the writer catch up
        before it processes more. O(stateful steps)."""
        return any(cache.over_budget for cache in self.backends.values())

    def cache_stats(self) -> dict:
        """Per stateful step: what its cache holds and did (:meth:`StateCache.stats`)."""
        return {step_name: cache.stats() for step_name, cache in self.backends.items()}

    def take(self, snapshot_id: int, t: tuple, reader: Any, prepared: Callable[[SnapshotPart], None]) -> None:
        """Take what changed and the source positions now; store them in the background,
        then call ``prepared(part)`` in the event loop: this instance's
        :class:`SnapshotPart` of the manifest (its ``error`` set if a write failed)."""
        if self.store is None:
            prepared(SnapshotPart())
            return
        now = time.time()
        jobs, entries = {}, {}
        for step_name, cache in self.backends.items():
            chain = self.chains[step_name]
            changes = cache.take_changes()
            if changes is None or chain.needs_base(now):
                jobs[step_name] = ("base", cache.take_unwritten())
                chain.add_base(snapshot_id, now)
            elif changes:  # nothing changed: the chain as it is describes this snapshot too
                jobs[step_name] = ("delta", changes)
                chain.add_delta(snapshot_id)
            entries[step_name] = chain.entry(self.participant(step_name))
        sources = reader.resume_positions(t) if reader is not None else {}
        part = SnapshotPart(states=entries, sources={str(p): list(pos) for p, pos in sources.items()})
        self._queue.append((snapshot_id, jobs, part, prepared))
        if self.deferred:
            return
        small = sum(len(batch) for _, batch in jobs.values()) <= INLINE_DELTA_KEYS
        if small and self._writer is None and self.store.is_local and all(kind == "delta" for kind, _ in jobs.values()):
            # A short interval's delta is a few kilobytes of inputs: encoded and written here
            # in about 1 ms of CPU (~90 keys at 50 ms snapshots); a task would cost more.
            self.write_next()
        elif self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())

    def pending_writes(self) -> int:
        """Snapshots taken and not yet written."""
        return len(self._queue)

    def write_next(self) -> None:
        """Write the oldest queued snapshot now, in this call (slices run back to back)."""
        steps, reply = self._write_first(), None
        while (step := _resume(steps, reply)) is not None:
            reply = _run_io(step) if isinstance(step, _Io) else time.sleep(step)

    async def _write_queued(self) -> None:
        """The writer task: persists queued snapshots in order, yielding to the loop every slice.

        Not a thread: a thread encoding states holds the interpreter lock in 1 ms turns, and
        the event loop then waits up to a turn each time it takes the lock back, after every
        socket read, write or poll: a base or a 1 s delta (20 to 60 ms of encoding) slowed
        every element in flight by several milliseconds while it lasted.
        """
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                steps, reply = self._write_first(), None
                while (step := _resume(steps, reply)) is not None:
                    if isinstance(step, _Io):
                        reply = await loop.run_in_executor(self._io, _run_io, step)
                    else:
                        reply = await asyncio.sleep(step)
        finally:
            self._writer = None

    def _write_first(self) -> Generator:
        """Persist the oldest queued snapshot, then report it (:meth:`_written`). A generator:
        it yields a pause in seconds where the event loop may take a turn, or an
        :class:`_Io` to run in the I/O thread (the reply: None, or the exception it raised)."""
        snapshot_id, jobs, part, prepared = self._queue[0]
        error: Optional[BaseException] = None
        try:
            yield from self._persist(snapshot_id, jobs)
        except Exception as exc:
            error = exc
        self._queue.popleft()
        self._written(error, jobs, part, prepared)

    def _written(self, error: Optional[BaseException], jobs: dict, part: SnapshotPart, prepared: Callable[[SnapshotPart], None]) -> None:
        """In the event loop, once the snapshot's writes are done (``error`` None) or failed."""
        for step_name, (kind, batch) in jobs.items():
            cache = self.backends[step_name]
            if error is None and kind == "base":
                cache.end_write()  # its items were marked written by _persist
            elif error is not None:
                self.chains[step_name].reset()
                if kind == "base":
                    cache.unwritten_again(batch)
        prepared(part if error is None else SnapshotPart(error=f"{type(error).__name__}: {error}"))

    def _persist(self, snapshot_id: int, jobs: dict) -> Generator:
        for step_name, (kind, batch) in jobs.items():
            try:
                if kind == "base":
                    cache = self.backends[step_name]
                    yield from self._in_slices(_chunks(batch.items(), WRITE_CHUNK), cache.write_items)
                    yield from _flushed(cache)
                    local = cache.checkpoint(self.workdir / f"ckpt-{snapshot_id}-{step_name}")
                    yield from self._io_call(self.store.upload, snapshot_id, self.participant(step_name), local)
                    shutil.rmtree(local, ignore_errors=True)
                    self._broken.discard(step_name)
                else:
                    self._check_chain(step_name)
                    rows: list = []
                    encode_key = self.backends[step_name].db.keys.encode
                    yield from self._in_slices(batch.items(), lambda item: rows.append(delta_row(encode_key(item[0]), *item[1])))
                    yield from self._io_call(self._write_delta, snapshot_id, step_name, pack_delta(rows))
            except BaseException:
                self._broken.add(step_name)
                raise
        # Only once every step's writes succeeded (a failure puts the bases' keys back as
        # unwritten, and a key marked clean may be evicted meanwhile), and in slices: marking
        # a base's rows clean is O(rows), ~12 ms in one callback for 12k rows. Far below its
        # budget a cache lets the marks wait (StateCache.written): only a drop needs them.
        for step_name, (kind, batch) in jobs.items():
            if kind == "base":
                cache = self.backends[step_name]
                for due, sizes in cache.written(batch):
                    yield from self._in_slices(_chunks(due.items(), WRITE_CHUNK), lambda rows: cache.mark_items_written(rows, sizes))

    def _in_slices(self, items: Iterable, fn: Callable[[Any], Any]) -> Generator:
        """``fn(item)`` for every item, yielding (a pause of 0: the event loop's turn) after each
        :attr:`slice_s` of it; the owner may change ``slice_s`` between turns."""
        deadline = time.perf_counter() + self.slice_s
        for item in items:
            fn(item)
            if time.perf_counter() > deadline:
                yield 0
                deadline = time.perf_counter() + self.slice_s

    def _check_chain(self, step_name: str) -> None:
        """Before encoding a delta: it must not build on a write that failed."""
        if step_name in self._broken:
            raise RuntimeError(f"step {step_name!r}: an earlier snapshot's write failed; the next base repairs the chain")

    def _write_delta(self, snapshot_id: int, step_name: str, data: bytes) -> None:
        self.store.put_file(snapshot_id, self.participant(step_name), DELTA_FILE, data)

    def _io_call(self, fn: Callable, *args: Any) -> Generator:
        """``fn(*args)`` here on a local store (a page-cache copy or hard links), in the I/O thread on a remote one."""
        if self._io is None:
            fn(*args)
            return
        error = yield _Io(fn, args)
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop writing (queued snapshots are dropped: this incarnation is gone) and release the backends."""
        if self._writer is not None:
            self._writer.cancel()  # it is suspended between slices: it never touches a backend again
        self._queue.clear()
        if self._io is not None:
            self._io.shutdown(wait=True, cancel_futures=True)
        for backend in self.backends.values():
            backend.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _Io(NamedTuple):
    """A call for the I/O thread, yielded by the writer's generators."""

    fn: Callable
    args: tuple


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    """``items`` in consecutive lists of ``size`` (the last may be shorter), made as they are
    taken: a base's items listed whole lived as long as its writes (a tuple an entry), and
    the collector went over them again and again.

    >>> list(_chunks({1: "a", 2: "b", 3: "c"}.items(), 2))
    [[(1, 'a'), (2, 'b')], [(3, 'c')]]
    """
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _resume(steps: Generator, reply: Any) -> Any:
    """The writer generator's next request (a pause or an :class:`_Io`), or None once it is done."""
    try:
        return steps.send(reply)
    except StopIteration:
        return None


def _run_io(io: _Io) -> Optional[Exception]:
    """Run ``io``; the exception it raised (the reply the generator re-raises), or None."""
    try:
        io.fn(*io.args)
    except Exception as exc:
        return exc
    return None





def _flushed(cache: StateCache, timeout: float = FLUSH_WAIT_S) -> Generator:
    """Flush ``cache``'s RocksDB memtable in RocksDB's own thread while the event loop goes on,
    polling every :data:`FLUSH_POLL_S`; the checkpoint that follows then has nothing to flush
    while it holds the interpreter lock. After ``timeout`` the checkpoint finishes the flush."""
    cache.start_flush()
    deadline = time.perf_counter() + timeout
    while cache.flushing() and time.perf_counter() < deadline:
        yield FLUSH_POLL_S


def _remove_stale_workdirs(scratch: str, participant_prefix: str) -> None:
    """Delete the working directories that earlier incarnations of this instance left behind.

    A killed process cannot clean up after itself. Only directories of processes that
    are gone (or of this one: a reset incarnation) are deleted: for a moment after a
    recovery two incarnations may both be alive, and the older one's open database
    must not vanish under it.
    """
    # <pid>-<mkdtemp's 8 characters>; anything else is another instance whose prefix
    # extends this one ("...-1" and "...-12-<pid>-...").
    for stale, pid in _workdirs(scratch, participant_prefix, r"(\d+)-[a-z0-9_]{8}").items():
        if pid == os.getpid() or not _alive(pid):
            shutil.rmtree(stale, ignore_errors=True)


def remove_dead_workdirs(stage_prefixes: Iterable[str], scratch: Optional[str] = None, wait_s: float = 3.0) -> int:
    """Delete what killed instances left on this node: the working directories (RocksDB
    files, checkpoints) of the instances of stages ``stage_prefixes`` (``flow-stage``, a
    participant without its index) whose processes are gone. A killed process cannot clean
    up, and a flow not started again under its name sends no incarnation to do it
    (:func:`_remove_stale_workdirs`); the supervisor calls this once it killed a run's
    actors, and waits up to ``wait_s`` for their processes to exit (``ray.kill`` does not
    wait). A directory whose process lives on is kept. Returns how many went.

    >>> import subprocess, sys
    >>> gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    >>> d = tempfile.mkdtemp(); dead = Path(d, f"driftstream-f-s-0-{gone.stdout.strip()}-abcdefgh")
    >>> live = Path(d, f"driftstream-f-s-1-{os.getpid()}-abcdefgh"); dead.mkdir(); live.mkdir()
    >>> remove_dead_workdirs(["f-s"], d, wait_s=0.1), dead.exists(), live.exists()
    (1, False, True)
    """
    candidates: dict = {}  # workdir -> the pid that made it
    for prefix in stage_prefixes:
        candidates.update(_workdirs(scratch or tempfile.gettempdir(), prefix, r"\d+-(\d+)-[a-z0-9_]{8}"))  # <index>-<pid>-<8>
    removed, deadline = 0, time.monotonic() + wait_s
    while candidates:
        for workdir, pid in list(candidates.items()):
            if not _alive(pid):
                shutil.rmtree(workdir, ignore_errors=True)
                del candidates[workdir]
                removed += 1
        if not candidates or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return removed


def _workdirs(scratch: str, prefix: str, rest: str) -> dict:
    """``{directory: the pid that made it}`` of the working directories ``driftstream-<prefix>-<rest>``
    under ``scratch``, ``rest`` a pattern whose one group is the pid."""
    head = f"driftstream-{prefix}-"
    found = {}
    for workdir in Path(scratch).glob(f"{head}*"):
        match = re.fullmatch(rest, workdir.name[len(head) :])
        if match is not None and workdir.is_dir():
            found[workdir] = int(match.group(1))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
