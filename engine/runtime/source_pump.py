"""The task that drives a source instance's reader inside its stage actor's event loop.

:class:`~driftstream.engine.connectors.source_reader.SourceReader` knows what may be read
(credit, alignment, partitions); the pump decides when: it polls while there is credit,
hands each batch to the stage, flushes what the stage made, and sleeps while the reader
waits (for the watermark to return credit, or the frontier to let an aligned partition
read on). A watermark or an ``Align`` message wakes it.

In a backlog it *lingers*: the output of consecutive full reads goes out in one flush, up to
about ``batch_size`` elements or :data:`LINGER_S` after the first read held (one batch per
receiver and one ``Ack`` where each read sent its own). Each message costs its sender, its
receiver and the acker ~0.1 ms of CPU whatever it holds: Nexmark q8's sources made 2-10
elements a read, the stages downstream spent most of their CPU on the messages. A read that
is not full (the live edge), a reader waiting for the frontier or out of credit, and the
end flush at once: at the live edge nothing waits.

>>> import asyncio
>>> from driftstream.engine.connectors.source_reader import SourceReader
>>> from driftstream.engine.testing import MemorySource
>>> reader = SourceReader(MemorySource([1, 2, 3]), source_id=0, instance=0, instances=1, max_inflight=10, batch_size=2)
>>> got = []
>>> async def main():
...     pump = SourcePump(reader, 0, batch_size=2, process=lambda items: got.extend(p for _, p in items) is None,
...                       flush=lambda more: 0, fail=print)
...     pump.start()
...     await pump.task
>>> asyncio.run(main()); got
[1, 2, 3]
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.read_size import ReadSize

#: Seconds the pump sleeps at most while its partitions have nothing to read.
IDLE_WAIT_S = 0.01

#: Seconds between looks at whether the owner still holds reading back (``held``).
HELD_WAIT_S = 0.002

#: The longest a backlog's read waits for the reads after it to go out with them (see above).
LINGER_S = 0.005


class SourcePump:
    """Reads ``reader`` in batches of at most ``batch_size`` while it has credit: fewer when
    each record makes much work in the stage (``work() -> int``: the items the stage's steps
    took so far; see :mod:`.read_size`).

    ``process(items) -> bool``: the stage takes a batch (False: the run has failed, stop);
    ``flush(more) -> int``: send what the stage made (``more``: records are left to read, so
    receivers should wait for this instance's next batch), returns the elements sent;
    ``fail(exc)``: the reader raised (the run must fail: a recovery would fail the same way);
    ``alive() -> bool``: False once the run has failed (the pump then stops);
    ``took(seconds)``: one read took that long, processed and flushed (the owner gives the
    snapshot writer a turn as long, see :func:`.batch_drain.writer_turn`);
    ``held() -> bool``: True while the owner holds reading back (a state cache over its
    budget waiting for a base); ``pending() -> int``: the elements the stage holds for its
    receivers, not flushed yet (given: the pump lingers in a backlog; None: it flushes every read).
    """

    def __init__(self, reader: SourceReader, source_index: int, batch_size: int, process: Callable[[list], bool],
                 flush: Callable[[bool], int], fail: Callable[[BaseException], None],
                 alive: Callable[[], bool] = lambda: True, took: Callable[[float], None] = lambda seconds: None,
                 held: Callable[[], bool] = lambda: False, work: Callable[[], int] = lambda: 0,
                 pending: Optional[Callable[[], int]] = None) -> None:
        self.reader = reader
        self.source_index = source_index
        self.size = ReadSize(batch_size)
        self._work = work
        self._process, self._flush, self._fail, self._alive = process, flush, fail, alive
        self._took, self._held, self._pending = took, held, pending
        #: when the first read whose output waits in the stage was made (None: nothing waits)
        self.lingering: Optional[float] = None
        self.task: Optional[asyncio.Task] = None
        self.credit = asyncio.Event()

    @classmethod
    def of_instance(cls, plan: Plan, key: Instance, config: InstanceConfig, **callbacks: Any) -> Optional["SourcePump"]:
        """The pump of instance ``key`` of ``plan`` over :meth:`SourceReader.of_instance` (None if
        its stage has no source); ``callbacks``: the constructor's."""
        reader = SourceReader.of_instance(plan, key, config)
        return None if reader is None else cls(reader, plan.source_instances.index(key), config.batch_size, **callbacks)

    def start(self, skip_after: Optional[tuple] = None) -> int:
        """Start reading (in the running loop). ``skip_after`` (at-most-once recovery): replay
        only up to that time, then skip to the live end; returns the records skipped."""
        skipped = self.reader.skip_after(skip_after) if skip_after is not None else 0
        self.task = asyncio.get_running_loop().create_task(self._run())
        return skipped

    def resume(self) -> None:
        """Read again after :meth:`pause` (a drain given up on), unless the run has failed."""
        if self.task is None and self._alive():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def pause(self) -> None:
        """Stop reading once the read in progress is handed over."""
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None

    def stop(self) -> None:
        """Stop reading (the incarnation ends); the read in progress is dropped."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def on_watermark(self, watermark: tuple) -> None:
        """The reader's elements below ``watermark`` settled: their credit comes back; read on."""
        self.reader.on_watermark(watermark)
        self.credit.set()

    def align(self, frontier: Any) -> None:
        """The frontier of the aligned sources moved (an ``Align``): an aligned partition
        waiting for it reads on."""
        self.reader.align(frontier)
        self.credit.set()

    def _linger(self, more: bool, waiting: int, made: int, started: float) -> bool:
        """Whether the ``waiting`` elements, ``made`` of them by the read just made, may wait for
        the next read's: the backlog goes on (``more``), credit and the frontier let the next read
        come at once, and a read like this one would keep them within ``batch_size`` elements
        and :data:`LINGER_S`. O(1)."""
        reader = self.reader
        if not more or not reader.has_credit() or reader.waiting():
            return False
        if waiting + made > self.size.batch_size:
            return False
        if self.lingering is None:
            self.lingering = started
        return started - self.lingering < LINGER_S

    def _flush_now(self, more: bool) -> int:
        """Flush what the stage made (the reads that lingered too); returns the elements sent."""
        self.lingering = None
        return self._flush(more)

    async def _run(self) -> None:
        reader, credit = self.reader, self.credit
        pending = self._pending or (lambda: 0)
        while not reader.done and self._alive():
            if self._held():
                if self.lingering is not None:
                    self._flush_now(True)
                await asyncio.sleep(HELD_WAIT_S)
                continue
            if not reader.has_credit():
                if self.lingering is not None:
                    self._flush_now(True)  # the watermark that returns credit must see these reads
                credit.clear()
                await credit.wait()
                continue
            started = time.perf_counter()
            asked, work, before = self.size.next, self._work(), pending()
            try:
                items = reader.poll(asked)
            except Exception as exc:
                # A source that cannot read on (a codec not installed, a broker gone for its
                # broker_timeout_s) would fail the same way after a recovery: the run fails.
                self._fail(exc)
                return
            if items and not self._process(items):
                return
            # Records left to read (a full read, or a known lag) mean the receivers' input merge
            # waits for this instance's next batch (ordering/input_merge.py), even out of credit:
            # the items they hold for it do not hold the watermark (StageRuntime._hold_at_held),
            # so its credit comes back.
            more = bool(items) and (len(items) >= asked or bool(reader.lag()))
            if self._pending is None:
                made = self._flush_now(more)
            else:
                waiting = self._pending()
                made = waiting - before
                if not self._linger(more, waiting, made, started):
                    self._flush_now(more)
            if items:
                reader.made(len(items), made)
                self.size.made(len(items), self._work() - work)
                # In a stage whose source feeds its stateful steps (a fused flow) these reads are
                # the loop's work: the snapshot writer's turns must match them, or a base written
                # in 1 ms turns behind reads of ~100 ms never completes within the backlog.
                self._took(time.perf_counter() - started)
                await asyncio.sleep(0)
            elif reader.waiting():
                # Every partition with data waits for the frontier: the next Align wakes it.
                credit.clear()
                try:
                    await asyncio.wait_for(credit.wait(), IDLE_WAIT_S)
                except asyncio.TimeoutError:
                    pass
            else:
                wait = reader.next_ready_in()
                await asyncio.sleep(min(wait if wait is not None else 0.001, IDLE_WAIT_S))
        if self._alive():
            self._flush_now(False)
