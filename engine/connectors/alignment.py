"""Aligned sources: in a backlog, no source partition runs ahead of the slowest one.

Every source instance reads its partitions at its own pace. In a backlog one of them may
be thousands of elements ahead in t of another, and every keyed step then receives the
slower one's elements "late": drifting state repairs each of them (a rollback and a
re-application), which is the right policy at the live edge and the wrong one in a
backlog. Flink's watermark alignment (FLIP-182) holds back the sources that run ahead;
here the same is done in t: the acker tells every source instance the *frontier*, the
least bound over all source instances (every partition has emitted everything up to it),
and a partition emits an element only while its ``ts`` is within ``slack`` of the
frontier's. What it read beyond that waits in a buffer of the partition, which then
bounds itself just below the first element waiting, so that the frontier moves with it
and the slowest partition can always emit.

At the live edge nothing waits: a partition that has read all its source holds (its
``lag()`` is 0) emits at once. Holding it there cost the inverted index's p99 at 50
docs/s ~10 ms (4 interleaved rounds) for nothing: the input merge orders what arrives
together, and the watermark would not release an element before the frontier passes it
anyway. A partition that cannot say its lag (None) is held as one behind.

>>> from driftstream.engine.testing import MemorySource
>>> align = Alignment(slack=1)
>>> part = HeldPartition(MemorySource(list("abcdef")).open(0, 0), align)
>>> [p for _, p in part.read(10)], part.bound()      # frontier unknown: nothing leaves
([], (0, 0, 0, -1))
>>> align.frontier = (2, 0, 0, 2)                         # every partition is past ts 2
>>> [p for _, p in part.read(10)], part.bound(), part.position()
(['a', 'b', 'c', 'd'], (4, 0, 0, 3), (4, 4))
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from driftstream.ordering.meta import BOTTOM, Time

from driftstream.engine.model.connectors import SourcePartition


#: The fewest of its own records a partition may read past the frontier per round trip to the
#: acker: the slack stretches to this many times the partition's spacing between records.
#: Without it a sparse backlog (a record every 100 ms of record time, slack 2 ms) read one
#: record per round trip; a dense one (many records per ms) is held by the slack alone.
ALIGNMENT_RUN = 16
#: ...and the elements those records may make downstream (what a keyed step would receive out
#: of order): a record that makes one element gets a run of 128, one that makes ~50 (a
#: document into words) stays at :data:`ALIGNMENT_RUN`, one that makes ~0.1 (Nexmark q8's
#: events, of which people and auctions go on) up to :data:`ALIGNMENT_MAX_RUN`. The run trades
#: rate for order by the work a record makes: Nexmark q7 from two files (300k events, a record
#: every 10 ms, one element each) read 21k events/s with a run of 16 and 14 elements out of
#: order, 62k with 128 and 731 (0.26%), 75k with 512 and 8,339 (3%), unaligned 72k and 35,509;
#: the inverted index went from 0.3-0.4% out of order with 16 to 8.8% with 128 (and from
#: 344-477 to 250 docs/s). A sparse source's run is capped in records only by the credit it
#: leaves: capped at 128 records, q8's sources sent 2-10 elements a round trip and a watermark
#: went to every instance per ~100 events (issue 57); at 1,024 half as many.
ALIGNMENT_ELEMENTS = 128
ALIGNMENT_MAX_RUN = 1024


class Alignment:
    """The frontier a source instance last heard of, and how far past it (``slack``, in the
    source's time units: milliseconds for Kafka, positions for an in-memory source) its
    partitions may emit: at least ``run`` of their own records (see :data:`ALIGNMENT_RUN`).

    >>> a = Alignment(slack=5); a.limit()
    -inf
    >>> a.frontier = (100, 0, 1, 7); a.limit(), a.limit(spacing=1.0), a.limit(spacing=100.0)
    (105, 116.0, 1700.0)
    """

    def __init__(self, slack: float, run: int = ALIGNMENT_RUN) -> None:
        self.slack, self.run = slack, run
        self.frontier: Time = BOTTOM
        self._fan_out: Optional[float] = None  # elements sent downstream per record, a moving average

    def made(self, records: int, elements: int) -> None:
        """``records`` read made ``elements`` downstream: the run becomes
        :data:`ALIGNMENT_ELEMENTS` elements' worth of records, within
        [:data:`ALIGNMENT_RUN`, :data:`ALIGNMENT_MAX_RUN`]. O(1).

        >>> a = Alignment(slack=2); a.made(100, 5000); a.run      # a document into ~50 words
        16
        >>> a = Alignment(slack=2); a.made(100, 92); a.run        # Nexmark's bids of its events
        139
        >>> a = Alignment(slack=2); a.made(100, 8); a.run         # q8's people and auctions of them
        1024
        """
        if records <= 0:
            return
        fan_out = elements / records
        self._fan_out = fan_out if self._fan_out is None else 0.75 * self._fan_out + 0.25 * fan_out
        self.run = int(min(ALIGNMENT_MAX_RUN, max(ALIGNMENT_RUN, ALIGNMENT_ELEMENTS / max(self._fan_out, 1e-9))))

    def limit(self, spacing: float = 0.0) -> float:
        """The largest ``ts`` an element of a partition whose records are ``spacing`` apart
        (in ts) may have to be emitted now. O(1)."""
        return self.frontier[0] + max(self.slack, spacing * self.run)


class HeldPartition(SourcePartition):
    """``part``, its reads past ``alignment``'s limit held back until the frontier moves.

    Costs: a read is O(items read); the elements it holds are kept (at most one read past
    the limit, plus what waited before)."""

    def __init__(self, part: SourcePartition, alignment: Alignment) -> None:
        self.part = part
        self.alignment = alignment
        self.held: deque = deque()
        #: the ts between two of its records, a moving average over its reads (0: unknown)
        self.spacing = 0.0
        self._last_ts: Optional[float] = None

    @property
    def done(self) -> bool:  # type: ignore[override]
        return self.part.done and not self.held

    def read(self, max_items: int) -> list:
        """Up to ``max_items`` elements within the limit, those that waited first."""
        if len(self.held) < max_items and not self.part.done:
            fresh = self.part.read(max_items - len(self.held))
            if fresh:
                self._measure(fresh)
                self.held.extend(fresh)
        lag = self.part.lag()
        # Caught up (the live edge): nothing to align; what it read is as new as anyone's.
        limit = self.alignment.limit(self.spacing) if lag is None or lag > 0 else float("inf")
        held, out = self.held, []
        while held and len(out) < max_items and held[0][0][0] <= limit:
            out.append(held.popleft())
        return out

    def _measure(self, fresh: list) -> None:
        """Fold the spacing of ``fresh`` records (after the last one read) into ``spacing``."""
        last = fresh[-1][0][0]
        if self._last_ts is not None:
            gap = max(0.0, (last - self._last_ts) / len(fresh))
            self.spacing = gap if self.spacing == 0.0 else 0.75 * self.spacing + 0.25 * gap
        self._last_ts = last

    def waiting(self) -> bool:
        """True while an element read waits for the frontier."""
        return bool(self.held)

    def bound(self) -> Optional[Time]:
        if self.held:
            # Everything before the first element waiting was emitted; every element still to
            # come from this partition is at or after it (offsets rise, ts is a running max).
            ts, source, partition, offset = self.held[0][0][:4]
            return (ts, source, partition, offset - 1)
        return self.part.bound()

    def position(self) -> tuple:
        if self.held:
            meta = self.held[0][0]
            return (meta[3], meta[0])  # replay from it, its own ts as the running ts
        return self.part.position()

    def next_ready_in(self) -> Optional[float]:
        return self.part.next_ready_in()

    def skip_after(self, t: Time) -> int:
        return self.part.skip_after(t)

    def lag(self) -> Optional[int]:
        lag = self.part.lag()
        return None if lag is None else lag + len(self.held)

    def fetch_state(self) -> Optional[dict]:
        return self.part.fetch_state()

    def close(self) -> None:
        self.part.close()
