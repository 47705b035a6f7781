"""The queue of a stage instance's incoming batches, processed a chunk per event-loop callback.

Batches queue up while the loop is busy; in a backlog, thousands of them. Taken at once
they held the loop for seconds (a stateful step re-applying its keys), pings went
unanswered and the supervisor replaced the actor as hung, over and over. A chunk of
:data:`DRAIN_CHUNK` elements per callback gives pings, watermarks and sink
acknowledgements a turn between.

A state cache over its budget while a base is written (it may spill nothing until the
base is durable) holds processing back until the writer is done: memory stays within the
budget instead of growing with the backlog.

The input merge may hold items back for a sender that went quiet: the drain looks
again once it has been quiet long enough (:meth:`BatchDrain.release_later`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from driftstream.engine.runtime.stage import StageRuntime
from driftstream.engine.runtime.stage_snapshots import SLICE_S, StageSnapshots

#: Elements of queued batches processed in one event-loop callback.
DRAIN_CHUNK = 4096

#: The longest turn the snapshot writer gets when the loop is busy.
MAX_WRITER_SLICE_S = 0.25

#: Seconds between looks at a state cache over its budget, waiting for a base.
BUDGET_WAIT_S = 0.002


def writer_turn(snapshots: StageSnapshots, took: float) -> None:
    """The snapshot writer's next turn lasts as long as the owner's callback that ``took``
    seconds (within bounds): a snapshot gets about half of a busy loop. O(1)."""
    snapshots.slice_s = min(MAX_WRITER_SLICE_S, max(SLICE_S, took))


def hold_for_budget(snapshots: StageSnapshots) -> bool:
    """True while a state cache is over its budget waiting for a base: the owner processes
    nothing more meanwhile, and the writer gets its longest turns to catch up. O(stateful steps)."""
    if snapshots.over_budget():
        snapshots.slice_s = MAX_WRITER_SLICE_S
        return True
    return False


class BatchDrain:
    """Incoming batches of one incarnation of a stage instance, for ``rt``.

    ``run(fn, *args) -> bool``: the owner runs a step of ``rt`` (False: the run has failed
    and nothing ran); ``flush()``: the owner sends what ``rt`` made. After :meth:`close`
    (the incarnation was reset) callbacks already scheduled do nothing.
    """

    def __init__(self, rt: StageRuntime, snapshots: StageSnapshots, run: Callable[..., bool], flush: Callable[[], Any],
                 took: Optional[Callable[[list], None]] = None) -> None:
        self.rt, self.snapshots, self._run, self._flush = rt, snapshots, run, flush
        #: recovery="local": hears each chunk of batches before it is processed (None: the default path)
        self.took = took
        self.inbox: list = []
        self.drain_scheduled = False
        self.release_scheduled = False
        self.closed = False

    def push(self, batch: Any) -> None:
        """Queue ``batch``; batches queued behind each other are processed together
        (see :meth:`StageRuntime.receive_many`). O(1)."""
        self.inbox.append(batch)
        if not self.drain_scheduled:
            self.drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def close(self) -> None:
        self.closed = True

    def drop_from(self, sender: Any) -> int:
        """``recovery="local"``: forget the queued batches of ``sender``, a peer that died (as
        if lost in flight: each is at or above the cut, its replacement sends them again).
        Returns how many."""
        kept = [b for b in self.inbox if b.sender != sender]
        dropped, self.inbox = len(self.inbox) - len(kept), kept
        return dropped

    def _drain(self) -> None:
        if self.closed:
            return
        rt, snapshots = self.rt, self.snapshots
        if hold_for_budget(snapshots):
            asyncio.get_running_loop().call_later(BUDGET_WAIT_S, self._drain)
            return
        inbox, n, size = self.inbox, 0, 0
        while n < len(inbox) and size < DRAIN_CHUNK:
            size += len(inbox[n].items)
            n += 1
        batches, self.inbox = inbox[:n], inbox[n:]
        backlogged = bool(self.inbox)
        if backlogged:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self.drain_scheduled = False
        started = time.perf_counter()
        if self.took is not None:
            self.took(batches)
        if self._run(rt.receive_many, batches):
            rt.more = backlogged
            self._flush()
        self.release_later()
        # The snapshot writer's next turn lasts as long as this callback did (within bounds): a
        # snapshot gets about half of a busy loop. With 1 ms turns behind each 50-100 ms of
        # processing, a base of 17k entries (~0.1 s of work) took 15 s in a backlog, and the
        # changes waiting for it grew past the budget. At low rates a callback takes well
        # under a millisecond, so turns stay short: every element in flight waits behind each.
        writer_turn(snapshots, time.perf_counter() - started)

    def release_later(self) -> None:
        """The input merge holds items for a sender that may have gone quiet: look again
        once it has been quiet long enough (the most any item is held)."""
        rt = self.rt
        if rt.holding and not self.release_scheduled:
            self.release_scheduled = True
            asyncio.get_running_loop().call_later(rt.merge.quiet_s, self._release_held)

    def _release_held(self) -> None:
        if self.closed:
            return
        self.release_scheduled = False
        if self._run(self.rt.release_held):
            self.rt.more = bool(self.inbox)
            self._flush()
        self.release_later()
