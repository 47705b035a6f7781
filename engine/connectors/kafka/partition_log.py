"""One partition's log as a reader at an isolation level sees it: records in offset order,
each step with the offset it takes the reader to.

``read_committed`` (the default of :class:`.KafkaSource`, as of Kafka's consumers and
Flink's source): fetches ask for ``isolation_level=1``, so the broker answers up to the
last stable offset; the records of aborted transactions are dropped, those of committed
ones delivered once their outcome is known (:mod:`.transactions`): from the aborted
transactions the broker lists, or from the producer's marker in the log. A marker past the
answer (the transaction ended while an older one was still open, so the last stable offset
is below it) is looked for ahead, in batch headers read with ``isolation_level=0`` from
where the markers are known; nothing is delivered past an undecided batch meanwhile.
``read_uncommitted``: every data record up to the high watermark. Either way control
batches and dropped records are stepped over at once, not waited for as holes
(:class:`.OffsetGaps` waits only for offsets no batch has shown).

>>> log = PartitionLog(TopicFetcher(bs, "docs", [0]), 0, offset=0)   # doctest: +SKIP
>>> step = log.read()                                                 # doctest: +SKIP
>>> [r.offset for r in step.records], step.through                    # doctest: +SKIP
([0, 1, 3], 5)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from driftstream.engine.connectors.kafka.offset_gaps import OffsetGaps
from driftstream.engine.connectors.kafka.transactions import Batch, CommittedFilter
from driftstream.engine.connectors.kafka.wire import READ_COMMITTED, READ_UNCOMMITTED, TopicFetcher

#: Header reads ahead for one undecided batch's marker before the reader fetches again.
MARKER_READS = 64


@dataclass(frozen=True)
class Step:
    """What one read took the reader over: ``records`` (delivered, offset order) and
    ``through``, the offset after everything read (records, dropped ones, markers)."""

    records: list
    through: int


class PartitionLog:
    """Reads partition ``partition`` through ``fetcher`` from ``offset``. ``read()`` gives
    the next :class:`Step` or None (nothing new; ``caught_up`` then says whether the reader
    is at the end). One thread at a time."""

    def __init__(self, fetcher: TopicFetcher, partition: int, offset: int, committed: bool = True, gap_wait_s: float = 0.5) -> None:
        self.fetcher = fetcher
        self.partition = partition
        self.isolation_level = READ_COMMITTED if committed else READ_UNCOMMITTED
        self.name = f"{fetcher.topic}[{partition}]"
        self.gap_wait_s = gap_wait_s
        self.caught_up = False
        #: the high watermark of the last answer when it was below ``next_offset`` (else None):
        #: the log ends below what the reader has read (deleted, recreated, or reported short)
        self.end_below: Optional[int] = None
        self.markers_read_ahead = 0  # header reads that looked for a marker past an answer
        self.moved_to(offset)

    @property
    def next_offset(self) -> int:
        """Where the next fetch starts."""
        return self.gaps.next_offset

    def moved_to(self, offset: int) -> None:
        """Read on from ``offset`` (a start, or a jump): nothing before it matters."""
        self.gaps = OffsetGaps(offset, self.gap_wait_s, name=self.name)
        self.filter = CommittedFilter(offset) if self.isolation_level == READ_COMMITTED else None
        self._ahead = OffsetGaps(offset, self.gap_wait_s, name=f"{self.name} (markers read ahead)")

    def read(self) -> Optional[Step]:
        """One fetch: what it took the reader over, or None. O(bytes fetched)."""
        p = self.partition
        answer = self.fetcher.fetch_answers({p: self.gaps.next_offset}, self.isolation_level).get(p)
        if answer is None or not answer.batches:
            self.caught_up = answer is not None and answer.high_watermark <= self.gaps.next_offset
            self.end_below = answer.high_watermark if answer is not None and answer.high_watermark < self.gaps.next_offset else None
            return None
        self.caught_up = False
        self.end_below = None
        start = self.gaps.next_offset
        batches = self.gaps.admit(answer.batches, time.monotonic())
        if not batches:
            time.sleep(0.001)  # a hole's batch is being stored: give the broker a moment
            return None
        if self.filter is None:
            return Step([r for b in batches for r in b.records], batches[-1].next_offset)
        resolved = self.filter.resolve(batches, answer.aborted)
        if resolved.undecided is not None:
            self.gaps.moved_to(resolved.through)  # fetch the undecided batch again once its marker is known
            self._read_ahead_for(resolved.undecided)
        if resolved.through == start:
            return None
        return Step(resolved.records, resolved.through)

    def _read_ahead_for(self, batch: Batch) -> None:
        """Learn markers from batch headers past what is known, up to the end of the log,
        until ``batch``'s outcome is known."""
        p, f = self.partition, self.filter
        for _ in range(MARKER_READS):
            if f.outcome(batch) is not None:
                return
            known = f.known_through
            if self._ahead.next_offset != known:
                self._ahead.moved_to(known)
            answer = self.fetcher.fetch_answers({p: known}, READ_UNCOMMITTED, decode=False).get(p)
            self.markers_read_ahead += 1
            if answer is None or not answer.batches:
                return  # the end of the log: the marker is not written yet
            f.learn(self._ahead.admit(answer.batches, time.monotonic()))
            if f.known_through == known:
                time.sleep(0.001)  # a hole: its batch is being stored, or it stays (then skipped after gap_wait_s)
                return

    def holds(self, offset: int) -> Optional[bool]:
        """Whether the log still has the batch holding ``offset`` (one the reader has read):
        False when a fetch there finds nothing and the log ends at or below it (the topic was
        deleted or recreated), None when the broker did not answer. One header-only fetch."""
        answer = self.fetcher.fetch_answers({self.partition: offset}, READ_UNCOMMITTED, decode=False).get(self.partition)
        if answer is None:
            return None
        return bool(answer.batches) or answer.high_watermark > offset

    def end_offset(self, deadline_s: float = 30.0) -> int:
        """The offset after the last batch this reader may read now: the last stable offset
        (read_committed) or the high watermark, made exact (Tansu reports its last batch's
        base offset + 1) by fetching the batch just below it. Markers included: a partition
        may end with one."""
        p, level = self.partition, self.isolation_level
        deadline = time.monotonic() + deadline_s
        reported: Optional[int] = None
        while time.monotonic() < deadline:
            if reported is None:
                answer = self.fetcher.fetch_answers({p: self.gaps.next_offset}, level, decode=False).get(p)
                if answer is None:
                    continue
                reported = answer.end(level)
                if reported <= 0:
                    return 0
            answer = self.fetcher.fetch_answers({p: reported - 1}, level, decode=False).get(p)
            if answer is not None and answer.batches:
                return max([reported] + [b.next_offset for b in answer.batches if b.offset < reported])
        raise TimeoutError(f"{self.name}: the broker reported its end at offset {reported} but returned no batch there "
                           f"within {deadline_s:g} s")
