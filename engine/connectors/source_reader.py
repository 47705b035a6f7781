"""The reader that drives one source instance: round-robin over its partitions, its bound, its credit.

>>> from driftstream.engine.testing import MemorySource
>>> src = MemorySource(["a", "b", "c"], partitions=2)
>>> reader = SourceReader(src, source_id=0, instance=0, instances=1, max_inflight=10, merged=False)
>>> [(m[0], p) for m, p in reader.poll(10)]       # (ts, payload): partition 0 first
[(0, 'a'), (2, 'c')]
>>> [(m[0], p) for m, p in reader.poll(10)]
[(1, 'b')]
>>> reader.done, reader.bound()
(True, (inf,))

Merged (the default), an instance of several partitions emits their records in t order
while each has data ready: a keyed step after it then applies them in order instead of
repairing its state (``out_of_order``). See :meth:`SourceReader._poll_merged`.

>>> merged = SourceReader(src, source_id=0, instance=0, instances=1, max_inflight=10)
>>> [[(m[0], p) for m, p in merged.poll(10)] for _ in range(2)]   # (partition 1's b is read after a)
[[(0, 'a')], [(1, 'b'), (2, 'c')]]
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from operator import itemgetter
from typing import Any, Optional

from driftstream.ordering.meta import BOTTOM, TOP, Time

from driftstream.engine.connectors.alignment import Alignment, HeldPartition
from driftstream.engine.model.config import InstanceConfig, plan_alignment, source_slack
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.connectors import Source


class SourceReader:
    """Reads one source instance's partitions round-robin, tracks its bound and its credit.

    Credit: at most ``max_inflight`` emitted elements may be unsettled (at or above
    the watermark) at once; ``on_watermark`` returns credit. That bounds every
    buffer downstream (stateful logs, barriers) by the in-flight window. Each
    partition may overshoot the slowest one by one read, so the window is at
    least ``(partitions + 1) * batch_size`` (and ``2 * partitions + 1``, see
    :meth:`poll`): a smaller one could starve the slowest partition of credit and
    stall the watermark. Times are kept per
    partition (increasing within one): across partitions a later read may be
    earlier in time, and a time that stays above the watermark must not keep
    the credit of those below it.
    """

    def __init__(
        self,
        source: Source,
        source_id: int,
        instance: int,
        instances: int,
        max_inflight: int,
        batch_size: int = 1,
        starts: Optional[dict] = None,
        alignment_slack: Any = None,
        merged: bool = True,
    ) -> None:
        """``alignment_slack``: how far past the frontier of all source instances (in the
        source's time units) a partition may emit, told by :meth:`align`; ``"auto"``: the
        source's own ``alignment_slack``; None: no alignment (see :mod:`.alignment`).
        ``merged``: emit several partitions' records in t order (see :meth:`_poll_merged`)."""
        starts = starts or {}
        self.numbers = [p for p in range(source.partitions()) if p % instances == instance]
        self.parts = [source.open(p, source_id, starts.get(p)) for p in self.numbers]
        slack = source_slack(alignment_slack, source)
        self.alignment = None if slack is None else Alignment(slack)
        if self.alignment is not None:
            self.parts = [HeldPartition(part, self.alignment) for part in self.parts]
        self._last: list = [BOTTOM] * len(self.parts)  # per partition: the last time emitted
        self.merged = merged and len(self.parts) > 1
        # Merged: per partition, records read but not emitted yet (they wait for the others'
        # earlier ones; at most one read's worth), and whether its last read found nothing.
        self._held: list = [[] for _ in self.parts]
        self._dry: list = [False] * len(self.parts)
        self.max_inflight = max(max_inflight, (len(self.parts) + 1) * batch_size, 2 * len(self.parts) + 1)
        self._inflight: list = [deque() for _ in self.parts]  # per partition: times emitted, not yet below the watermark
        self._in_flight = 0
        self.emitted = 0
        #: wall time of the first element this instance read (None: none yet); benchmarks time
        #: a backlog "from the first input read" with it, apart from the actors' start
        self.first_read_at: Optional[float] = None

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts) and not any(self._held)

    def _live(self, i: int) -> bool:
        return not self.parts[i].done or bool(self._held[i])

    @classmethod
    def of_instance(cls, plan: Plan, key: Instance, config: InstanceConfig) -> Optional["SourceReader"]:
        """The reader of instance ``key`` of ``plan`` (None if its stage has no source): its
        partitions, from the positions ``config`` restores, aligned as ``config`` says."""
        stage = plan.stages[key.stage]
        if stage.source_id < 0:
            return None
        step = plan.steps[stage.source_id]
        return cls(step.source, step.id, key.index, stage.parallelism, config.max_inflight, config.batch_size,
                   starts=config.restore.positions(), alignment_slack=plan_alignment(plan, config.source_alignment),
                   merged=config.input_merge)

    def has_credit(self) -> bool:
        return self._in_flight < self.max_inflight

    def bound(self) -> Time:
        """Every time at or below the bound that this instance will ever emit has been emitted."""
        live = [self._bound(i) for i in range(len(self.parts)) if self._live(i)]
        return min(live) if live else TOP

    def _bound(self, i: int) -> Time:
        held = self._held[i]
        if held:  # read, not emitted: the partition's own bound is past them
            # Just below the first held record: nothing of the partition lies between (offsets
            # are ints), so the watermark may pass what the others emitted below it.
            ts, source, partition, offset = held[0][0][:4]
            return (ts, source, partition, offset - 1) if type(offset) is int else self._last[i]
        known = self.parts[i].bound()
        return known if known is not None else self._last[i]

    def poll(self, max_items: int) -> list:
        """Read up to ``max_items`` (fewer when credit runs low) from the partition
        that is furthest behind in time and has data ready.

        Reading the laggard first keeps partitions aligned in time: fewer late
        arrivals downstream, and the watermark (the minimum bound) always moves,
        so credit always comes back, provided the laggard can always read: a partition
        whose first read comes late (a Kafka partition's first fetch) would otherwise find
        the credit spent by the others and hold the watermark for good. So every partition
        leaves 2 credits to each other one that has read nothing (its first element stays in
        flight until it reads the next), and 1 more when it is not the laggard itself.
        """
        if self.merged:
            return self._poll_merged(max_items)
        free = self.max_inflight - self._in_flight
        order = sorted((self._bound(i), i) for i, part in enumerate(self.parts) if not part.done)
        unread = sum(1 for bound, _ in order if bound == BOTTOM)
        for rank, (bound, i) in enumerate(order):
            reserve = 2 * (unread - (bound == BOTTOM)) + (rank > 0)
            budget = min(max_items, free - reserve)
            if budget <= 0:
                continue
            items = self.parts[i].read(budget)
            if items:
                return self._emit(i, items)
        return []

    def _emit(self, i: int, items: list) -> list:
        """``items`` of partition ``i`` leave: their credit is taken, its bound moves."""
        self._last[i] = items[-1][0][:4]
        append = self._inflight[i].append
        for meta, _ in items:
            append(meta[:4])
        self._in_flight += len(items)
        if not self.emitted:
            self.first_read_at = time.time()
        self.emitted += len(items)
        return items

    def _poll_merged(self, max_items: int) -> list:
        """:meth:`poll` emitting in t order across partitions. Reads go to the partition whose
        read frontier is least (the one holding the merge back) and wait in ``_held``; a poll
        emits every held record at or below the least frontier, the partitions' runs merged
        (a read's worth from each in a backlog, not a record at a time: their times
        interleave finely). A partition whose last read found nothing (an idle Kafka
        partition) holds nobody back: order is then given up for latency (a keyed step
        repairs what comes late). A held record counts in no bound. O(partitions) per round,
        at most partitions + 2 rounds; per record, a slice and a merge of sorted runs."""
        n, held = len(self.parts), self._held
        free = self.max_inflight - self._in_flight
        # as poll(): 2 credits left to each partition that has emitted nothing and holds nothing
        unread = sum(1 for i in range(n) if self._live(i) and self._last[i] == BOTTOM and not held[i])
        for _ in range(n + 2):
            waits = sorted((self._front(i), i) for i in range(n) if self._live(i) and (held[i] or not self._dry[i]))
            out = self._emit_merged(waits[0][0] if waits else TOP, min(max_items, free - 2 * unread))
            if out:
                return out
            # nothing held at or below the least frontier: read the laggard (an idle one too: it may have data now)
            for _, i in sorted((self._front(i), i) for i in range(n) if not self.parts[i].done):
                fresh = self._last[i] == BOTTOM and not held[i]
                budget = min(max_items, free - 2 * (unread - fresh))
                if budget <= 0:
                    continue
                items = self.parts[i].read(budget)
                self._dry[i] = not items
                if items:
                    held[i] = held[i] + items
                    break
            else:
                if not any(held):
                    return []  # nothing read, nothing held: the pump waits
                # the partitions read nothing (now dry: they hold nobody back) or lack credit
        return []

    def _front(self, i: int) -> Time:
        """Partition ``i``'s read frontier: every record it has still to read is past it."""
        if self.parts[i].done:
            return TOP
        held = self._held[i]
        last = held[-1][0][:4] if held else self._last[i]
        known = self.parts[i].bound()
        return last if known is None or known < last else known

    def _emit_merged(self, limit: Time, budget: int) -> list:
        """Emit the held records at or below ``limit`` (at most ``budget``), merged in t order."""
        if budget <= 0:
            return []
        held = self._held
        cuts = [(i, _cut(h, limit)) for i, h in enumerate(held) if h]
        cuts = [(i, c) for i, c in cuts if c]
        if not cuts:
            return []
        if sum(c for _, c in cuts) > budget:  # lower the limit to the budget's last record
            limit = sorted((item for i, c in cuts for item in held[i][:c]), key=_first)[budget - 1][0][:4]
            cuts = [(i, c) for i, c in ((i, _cut(held[i], limit)) for i, _ in cuts) if c]
        chunks = []
        for i, c in cuts:
            chunk, held[i] = held[i][:c], held[i][c:]
            chunks.append(self._emit(i, chunk))
        return chunks[0] if len(chunks) == 1 else sorted([item for chunk in chunks for item in chunk], key=_first)

    def align(self, frontier: Time) -> None:
        """The least bound over every source instance now (from the acker): partitions may
        emit up to the alignment's slack past it."""
        if self.alignment is not None and frontier > self.alignment.frontier:
            self.alignment.frontier = frontier

    def waiting(self) -> bool:
        """True when a partition holds elements back for the frontier (aligned sources only)."""
        return self.alignment is not None and any(p.waiting() for p in self.parts)

    def skip_after(self, t: Time) -> int:
        """See :meth:`SourcePartition.skip_after`; the records skipped over all partitions."""
        return sum(p.skip_after(t) for p in self.parts if not p.done)

    def lag(self) -> Optional[int]:
        """Records not yet emitted, summed over this instance's partitions (None if none knows)."""
        lags = [p.lag() for p in self.parts]
        known = [x for x in lags if x is not None]
        held = sum(len(h) for h in self._held)
        return sum(known) + held if known else (held or None)

    def fetch_states(self) -> list:
        """:meth:`SourcePartition.fetch_state` of each partition that has one."""
        return [st for st in (p.fetch_state() for p in self.parts) if st is not None]

    def next_ready_in(self) -> Optional[float]:
        if any(self._held):
            return 0.0
        waits = [w for w in (p.next_ready_in() for p in self.parts if not p.done) if w is not None]
        return min(waits) if waits else None

    def resume_positions(self, t: Time) -> dict:
        """Per partition number: where a replay must start to re-emit exactly the elements at or above ``t``.

        Call it when the watermark is ``t``: every element below ``t`` has left the
        in-flight window, so the first in-flight element of a partition is its first
        element at or above ``t``. Replaying from its offset with its own ts as the
        running ts reproduces the same times (the running max is idempotent).
        """
        out: dict = {}
        for p, part, times, held in zip(self.numbers, self.parts, self._inflight, self._held):
            first = next((time_ for time_ in times if time_ >= t), None)
            if first is None and held:  # read, not emitted: a replay reads it again
                first = held[0][0]
            out[p] = part.position() if first is None else (first[3], first[0])
        return out

    def made(self, records: int, elements: int) -> None:
        """The ``records`` of the last poll made ``elements`` downstream of the source's stage:
        an aligned reader's run follows it (:meth:`Alignment.made`)."""
        if self.alignment is not None:
            self.alignment.made(records, elements)

    def on_watermark(self, watermark: Time) -> None:
        for times in self._inflight:
            while times and times[0] < watermark:
                times.popleft()
                self._in_flight -= 1

    def close(self) -> None:
        for p in self.parts:
            p.close()


#: an item's meta (what merged runs are ordered by)
_first = itemgetter(0)


def _time(item: tuple) -> Time:
    return item[0][:4]


def _cut(run: list, limit: Time) -> int:
    """How many of ``run`` (one partition's records, in t order) are at or below ``limit``."""
    return len(run) if run[-1][0][:4] <= limit else bisect_right(run, limit, key=_time)
