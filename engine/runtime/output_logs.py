"""A stage instance's output logs: those of its steps declared ``deterministic=False``
(:class:`~driftstream.snapshots.output_log.OutputLog`, one per step), loaded at a restore,
written to the snapshot store in segments, and the acker messages that wait for them.

The rule that keeps output consistent without making it wait for a snapshot: an instance
sends the acker the acknowledgement of an input only once the outputs the log recorded for it
are durable. The watermark cannot pass an unacknowledged input (its sender's XOR is alone in
its entry, or its source's bound is not sent), and every output is at or after its input's
time, so no sink releases anything derived from a logged output before the store holds it,
and no snapshot at or after it commits. So every message to the acker (acks, bounds, snapshot
parts) goes through :meth:`OutputLogs.to_acker`, in order: sent at once when every entry
recorded is durable, else held until the writes that cover it are done.

>>> import tempfile
>>> from driftstream.snapshots.output_log import OutputLog
>>> log, sent = OutputLog(), []
>>> logs = OutputLogs({"noisy": log}, tempfile.mkdtemp(), "f", 0, sent.append)
>>> log.record((1, 0, 0, 1, (), False), [((1, 0, 0, 1, (), False), 0.5, None)])
>>> logs.to_acker("ack 1"); sent, logs.due
([], True)
>>> logs.write_all(); sent
['ack 1']
>>> again = OutputLog()
>>> _ = OutputLogs({"noisy": again}, logs.store_uri, "f", 1, sent.append, since=None)
>>> again.lookup((1, 0, 0, 1, (), False))
[((1, 0, 0, 1, (), False), 0.5, None)]

Costs: nothing for a stage without such a step (the host has no ``OutputLogs``); else a list
append per message to the acker while writes are due, and one segment write per log per
:meth:`write_all`, however many entries it holds (the writes batch themselves: entries recorded
while one is in progress wait for the next).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable, Optional

from driftstream.snapshots.output_log import OutputLog, encode_segment, segment_name
from driftstream.snapshots.output_segments import OutputSegments, trim_outputs
from driftstream.snapshots.snapshot_files import SnapshotFiles
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.plan import Instance, Plan


class OutputLogs:
    """The output logs of one incarnation of a stage instance (``logs``: step name ->
    :class:`OutputLog`), written under ``store_uri`` (None: the run takes no snapshots, nothing
    is written or held) as instance ``index`` of flow ``flow``. ``send(message)`` sends to the
    acker. ``since``: load the logged entries at or after that time (a restore); leave it out
    for a start from the beginning. ``wake``: called when entries wait to be written and no
    write is due yet (the Ray actor schedules :meth:`write_all`; the simulator polls :attr:`due`)."""

    def __init__(self, logs: dict, store_uri: Optional[str], flow: str, index: int, send: Callable[[Any], None],
                 since: Any = False, wake: Optional[Callable[[], None]] = None) -> None:
        self.logs, self.index, self.send, self.wake = logs, index, send, wake
        self.store_uri = store_uri
        files = SnapshotFiles(store_uri) if store_uri else None
        #: step name -> its segments in the store (empty without a store)
        self.segments = {name: OutputSegments(files, f"{flow}-{name}") for name in logs} if files else {}
        self.held: deque = deque()  # (the logs' appended counts, message), oldest first
        self.seq = 0
        self.woken = False
        self.closed = False
        #: the time its restore loaded the logs from (False: none loaded, a start from the beginning)
        self.since = since
        if not self.segments:
            for log in logs.values():
                log.pending = None  # nothing to make durable: record() keeps no entries to write
        elif since is not False:
            self.reload()

    def reload(self) -> None:
        """Load the logged entries at or after the restore's time (all of them after a start
        from the beginning: the run's own) as the store holds them now."""
        since = None if self.since is False else self.since
        for name, log in self.logs.items():
            seg = self.segments.get(name)
            for segment in () if seg is None else seg.names(since):
                log.load(seg.read(segment), since)

    @classmethod
    def of(cls, rt: Any, plan: Plan, key: Instance, config: InstanceConfig, send: Callable[[Any], None],
           recovering: bool = False) -> Optional["OutputLogs"]:
        """The output logs of :class:`~.stage.StageRuntime` ``rt`` (None if its stage has no step
        declared deterministic=False), loaded from the store when the instance restores (from a
        manifest, or ``recovering`` from the beginning)."""
        if not rt.output_logs:
            return None
        logs = {plan.steps[sid].name: log for sid, log in rt.output_logs.items()}
        since = config.restore_t if config.restore_t is not None else (None if recovering else False)
        return cls(logs, config.snapshot_dir, plan.flow_name, key.index, send, since)

    @property
    def due(self) -> bool:
        """Whether recorded entries wait to be written."""
        return bool(self.segments) and any(log.pending for log in self.logs.values())

    def to_acker(self, message: Any) -> None:
        """Send ``message`` to the acker once every entry recorded so far is durable (at once if
        it is, and nothing older is held)."""
        if not self.held and all(log.durable >= log.appended for log in self.logs.values()):
            self.send(message)
            return
        self.held.append((tuple(log.appended for log in self.logs.values()), message))
        if self.wake is not None and not self.woken:
            self.woken = True
            self.wake()

    def take_writes(self) -> list:
        """``[(step name, segment name, bytes, upto)]``: what to write now (the caller then calls
        :meth:`written`), one segment per log with entries waiting."""
        self.woken = False
        writes = []
        for name, log in self.logs.items():
            if log.pending:
                entries, upto = log.take_pending()
                writes.append((name, segment_name(time.time_ns(), self.index, self.seq, entries), encode_segment(entries), upto))
                self.seq += 1
        return writes

    def store(self, writes: list) -> None:
        """Write ``writes`` (:meth:`take_writes`) to the store (in the I/O thread on a remote store)."""
        for name, segment, data, _ in writes:
            self.segments[name].write(segment, data)

    def written(self, writes: list) -> None:
        """``writes`` are durable: send the acker messages that waited for them, in order."""
        if self.closed:
            return
        for name, _, _, upto in writes:
            self.logs[name].written(upto)
        durable = tuple(log.durable for log in self.logs.values())
        while self.held and all(d >= a for d, a in zip(durable, self.held[0][0])):
            self.send(self.held.popleft()[1])

    def write_all(self) -> None:
        """Write what waits, here, and send what waited for it."""
        writes = self.take_writes()
        self.store(writes)
        self.written(writes)

    def close(self) -> None:
        """This incarnation is gone: what it held is never sent."""
        self.closed = True
        self.held.clear()


def trim_logs(store: SnapshotStore, at_most: Optional[tuple] = None) -> int:
    """After a commit: delete the output log segments no restore can need, those wholly below
    the oldest committed snapshot's T (a restore starts at a committed snapshot, the newest or,
    when one is damaged, an older one), and below ``at_most`` if given (the simulator's votes:
    the snapshot a vote's rollback restores; the bottom, none yet: the beginning, every segment
    kept). Returns how many went. One listing of the snapshots, one manifest read and one
    listing per logged step."""
    for snapshot_id in store.committed_ids():
        manifest = store.read_manifest(snapshot_id)
        if manifest is not None:
            below = tuple(manifest["t"]) if at_most is None else min(tuple(manifest["t"]), at_most)
            return trim_outputs(store, below)
    return 0


#: How long the Ray actor's writer lets entries gather before a write. Written at once (one
#: segment per event-loop turn), a backlog of 300,000 elements through a declared map and a
#: running sum cost 2.70-3.27 s of CPU against 1.29-1.44 undeclared; gathered for 2 ms, 1.90-2.29
#: (examples/benchmarks/README.md). It delays a declared step's acknowledgements, so the
#: watermark and the release, by as much.
WRITE_AFTER_S = 0.002


class LogWriter:
    """The Ray actor's writer of ``logs``: woken when entries wait, it writes them in a callback
    of the event loop (a local store: a page-cache write) or in a thread (a remote store), one
    write at a time, so that what becomes durable is always a prefix of what was recorded;
    entries recorded during a write go in the next. ``fail(exc)``: a write the store refused
    fails the run (the acks it holds would otherwise stall the watermark for good)."""

    def __init__(self, logs: OutputLogs, fail: Callable[[BaseException], None]) -> None:
        self.logs, self.fail = logs, fail
        self.loop: Any = None  # the actor's event loop, where the host's messages are sent from
        self.local = SnapshotFiles(logs.store_uri).is_local if logs.store_uri else True
        self.writing = False
        logs.wake = self.wake

    def wake(self) -> None:
        if not self.writing:
            self.writing = True
            self.loop = self.loop or asyncio.get_running_loop()
            self.loop.call_later(WRITE_AFTER_S, self._write)

    def _write(self) -> None:
        logs = self.logs
        if logs.closed:
            return
        writes = logs.take_writes()
        if self.local:
            try:
                logs.store(writes)
            except Exception as exc:
                self.fail(exc)
                return
            self._done(writes)
            return
        future = self.loop.run_in_executor(None, logs.store, writes)
        future.add_done_callback(lambda f: self.fail(f.exception()) if f.exception() is not None else self._done(writes))

    def _done(self, writes: list) -> None:
        self.writing = False
        self.logs.written(writes)
        if self.logs.due or self.logs.held:
            self.wake()
