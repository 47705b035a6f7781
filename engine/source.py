"""Source interfaces and the reader that drives one source instance.

A source has partitions; each source instance reads the partitions
``p`` with ``p % instances == instance``. A partition produces elements with
their Meta already set from durable data only (an index, a Kafka offset and
timestamp), so a replay reproduces the same times.

>>> from driftstream.engine.testing import MemorySource
>>> src = MemorySource(["a", "b", "c"], partitions=2)
>>> reader = SourceReader(src, source_id=0, instance=0, instances=1, max_inflight=10)
>>> [(m[0], p) for m, p in reader.poll(10)]       # (ts, payload): partition 0 first
[(0, 'a'), (2, 'c')]
>>> [(m[0], p) for m, p in reader.poll(10)]
[(1, 'b')]
>>> reader.done, reader.bound()
(True, (inf,))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Optional

from driftstream.ordering.meta import BOTTOM, TOP, Time


class SourcePartition(ABC):
    """One partition of a source, read by exactly one source instance."""

    #: True once the partition will never produce another element.
    done: bool = False

    @abstractmethod
    def read(self, max_items: int) -> list:
        """Up to ``max_items`` ``(meta, payload)`` pairs, in increasing Meta order; [] if none is ready."""

    def next_ready_in(self) -> Optional[float]:
        """Seconds until the next element is ready, if the partition knows (paced sources)."""
        return None

    def bound(self) -> Optional[Time]:
        """A time below every element this partition will still produce, if it knows one
        from durable data (e.g. the next index of a list). None: the reader uses the
        time of the last element read, which is always safe but waits for the next one.
        """
        return None

    def close(self) -> None:
        """Release resources."""


class Source(ABC):
    """A named input of a flow. ``bounded`` sources end; unbounded ones run until stopped."""

    bounded: bool = True

    @abstractmethod
    def partitions(self) -> int:
        """How many partitions the source has."""

    @abstractmethod
    def open(self, partition: int, source_id: int) -> SourcePartition:
        """Open one partition; ``source_id`` is the Meta ``source`` field to stamp."""


class SourceReader:
    """Reads one source instance's partitions round-robin, tracks its bound and its credit.

    Credit: at most ``max_inflight`` emitted elements may be unsettled (at or above
    the watermark) at once; ``on_watermark`` returns credit. That bounds every
    buffer downstream (stateful logs, barriers) by the in-flight window. Each
    partition may overshoot the slowest one by one read, so the window is at
    least ``(partitions + 1) * batch_size``: a smaller one could starve the
    slowest partition of credit and stall the watermark.
    """

    def __init__(self, source: Source, source_id: int, instance: int, instances: int, max_inflight: int, batch_size: int = 1) -> None:
        self.parts = [source.open(p, source_id) for p in range(source.partitions()) if p % instances == instance]
        self._last: list = [BOTTOM] * len(self.parts)
        self.max_inflight = max(max_inflight, (len(self.parts) + 1) * batch_size)
        self._inflight: deque = deque()  # times emitted and not yet below the watermark
        self.emitted = 0

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts)

    def has_credit(self) -> bool:
        return len(self._inflight) < self.max_inflight

    def bound(self) -> Time:
        """Every time at or below the bound that this instance will ever emit has been emitted."""
        live = [self._bound(i) for i, part in enumerate(self.parts) if not part.done]
        return min(live) if live else TOP

    def _bound(self, i: int) -> Time:
        known = self.parts[i].bound()
        return known if known is not None else self._last[i]

    def poll(self, max_items: int) -> list:
        """Read up to ``max_items`` (fewer when credit runs low) from the partition
        that is furthest behind in time and has data ready.

        Reading the laggard first keeps partitions aligned in time: fewer late
        arrivals downstream, and the watermark (the minimum bound) always moves,
        so credit always comes back.
        """
        budget = min(max_items, self.max_inflight - len(self._inflight))
        if budget <= 0:
            return []
        order = sorted((self._bound(i), i) for i, part in enumerate(self.parts) if not part.done)
        for _, i in order:
            items = self.parts[i].read(budget)
            if items:
                self._last[i] = items[-1][0][:4]
                append = self._inflight.append
                for meta, _ in items:
                    append(meta[:4])
                self.emitted += len(items)
                return items
        return []

    @property
    def dead_letters(self) -> int:
        """Records its partitions sent to a dead-letter destination."""
        return sum(getattr(p, "dead_letters", 0) for p in self.parts)

    def next_ready_in(self) -> Optional[float]:
        waits = [w for w in (p.next_ready_in() for p in self.parts if not p.done) if w is not None]
        return min(waits) if waits else None

    def on_watermark(self, watermark: Time) -> None:
        inflight = self._inflight
        while inflight and inflight[0] < watermark:
            inflight.popleft()

    def close(self) -> None:
        for p in self.parts:
            p.close()

