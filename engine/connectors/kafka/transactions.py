"""Which records of a fetch answer a ``read_committed`` reader delivers.

A transactional producer writes its records in batches flagged transactional and
ends each transaction with a *marker*, a control batch (commit or abort) of its own
producer id. Kafka's consumer, fetching with ``isolation_level=1``, gets the records
up to the *last stable offset* (below it every transaction is decided) and, with them,
the list of aborted transactions that overlap the answer (producer id, first offset);
it drops a transactional batch whose producer has an aborted transaction begun at or
before it and not yet ended by its abort marker, and steps over every control batch.

Not every broker sends that list: Tansu 0.6.0 and librdkafka's mock cluster answer
with an empty one, and read_committed consumers then deliver aborted records. So here
a transactional batch is delivered only once its outcome is known: from the broker's
list (aborted), or from its producer's next marker in the log (commit or abort). The
marker of a transaction below the last stable offset is in the log already, though
possibly past the answer (a transaction that ended while an older one was still open):
the reader then looks ahead for it (:class:`.PartitionLog`), reading batch headers.
Either way what is delivered is a function of the log: a replay from any offset
delivers the same records.

:class:`CommittedFilter` is pure bookkeeping, O(batches + listed aborts) per answer.

>>> f = CommittedFilter(0)
>>> answer = [Batch(0, 2, producer_id=7, transactional=True, records=("a", "b")),
...           Batch(2, 3, producer_id=7, transactional=True, marker=False),      # abort
...           Batch(3, 4, records=("c",)),                                       # not transactional
...           Batch(4, 5, producer_id=7, transactional=True, records=("d",)),
...           Batch(5, 6, producer_id=7, transactional=True, marker=True)]       # commit
>>> f.resolve(answer, aborted=())
Resolved(records=['c', 'd'], through=6, undecided=None)
>>> r = f.resolve([Batch(6, 7, producer_id=8, transactional=True, records=("e",))], aborted=())   # no marker of 8 known yet
>>> r.records, r.through, r.undecided.offset
([], 6, 6)
>>> f.resolve([Batch(6, 7, producer_id=8, transactional=True, records=("e",))], aborted=[(8, 6)])   # listed: aborted
Resolved(records=[], through=7, undecided=None)
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

#: The two isolation levels of a Kafka reader, by their consumer-setting names.
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


@dataclass(frozen=True, slots=True)
class Batch:
    """One record batch of a partition as a fetch answer holds it.

    ``offset``: the first offset of it the reader has not had (its base offset, or the
    offset fetched from when the batch began before it); ``next_offset``: the offset after
    its last. ``marker``: a control batch's outcome (True commit, False abort), None for
    data. ``records``: a data batch's records from ``offset`` on (none when only its header
    was read). ``codec``: its compression (:mod:`.codecs`).
    """

    offset: int
    next_offset: int
    producer_id: int = -1
    transactional: bool = False
    marker: Optional[bool] = None
    records: Sequence = ()
    codec: int = 0


@dataclass(frozen=True)
class Resolved:
    """What a read_committed reader takes from an answer: ``records``, in offset order, and
    ``through``, the offset after the last batch decided (delivered or dropped). When
    ``undecided`` is a batch, its outcome is not known yet: ``through`` is its offset, and
    nothing from it on was taken."""

    records: list
    through: int
    undecided: Optional[Batch] = None


@dataclass
class CommittedFilter:
    """One partition's read_committed bookkeeping: the transaction markers known in the log
    from the reader's offset up to ``known_through`` (every marker below it is known), by
    producer.

    ``learn`` takes batches in offset order (the reader's own answers, or headers read
    ahead); ``resolve`` decides an answer's batches.
    """

    known_through: int
    _markers: dict = field(default_factory=dict)  # producer id -> sorted [(marker offset, commit)]

    def learn(self, batches: Iterable[Batch]) -> None:
        """Note the markers of ``batches``: offset order, continuing what is known (the
        reader's answers, or headers read ahead from ``known_through``). A hole in them must
        be one the reader gave up on (:class:`.OffsetGaps`): a marker in it stays unknown."""
        for b in batches:
            if b.marker is not None and b.offset >= self.known_through:
                insort(self._markers.setdefault(b.producer_id, []), (b.offset, b.marker))
            self.known_through = max(self.known_through, b.next_offset)

    def outcome(self, batch: Batch) -> Optional[bool]:
        """True (committed) or False (aborted) for a transactional data batch whose
        producer's next marker is known; None otherwise."""
        markers = self._markers.get(batch.producer_id)
        if not markers:
            return None
        i = bisect_right(markers, (batch.next_offset - 1, True))
        return markers[i][1] if i < len(markers) else None

    def resolve(self, batches: Sequence[Batch], aborted: Iterable[tuple]) -> Resolved:
        """The records of ``batches`` (contiguous, in offset order) that a read_committed
        reader delivers, up to the first batch whose outcome is unknown. ``aborted``: the
        answer's aborted transactions ``(producer id, first offset)`` (empty when the broker
        sends none)."""
        self.learn(batches)
        listed = [(first, pid) for pid, first in aborted]
        heapq.heapify(listed)
        aborting: set = set()  # producers inside an aborted transaction the broker listed
        records: list = []
        through = batches[0].offset if batches else self.known_through
        for b in batches:
            while listed and listed[0][0] < b.next_offset:
                aborting.add(heapq.heappop(listed)[1])
            if b.marker is not None:
                if not b.marker:
                    aborting.discard(b.producer_id)
            elif b.transactional and b.producer_id not in aborting:
                committed = self.outcome(b)
                if committed is None:
                    self._forget_before(through)
                    return Resolved(records, through, b)
                if committed:
                    records.extend(b.records)
            elif not b.transactional:
                records.extend(b.records)
            through = b.next_offset
        self._forget_before(through)
        return Resolved(records, through)

    def _forget_before(self, offset: int) -> None:
        # A batch at or after ``offset`` is decided by a marker after it: older ones are done with.
        for pid in list(self._markers):
            markers = self._markers[pid]
            del markers[:bisect_left(markers, (offset, False))]
            if not markers:
                del self._markers[pid]
