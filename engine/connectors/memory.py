"""In-memory sources and sinks: for tests, examples and the simulator. Users import them
from :mod:`driftstream.engine.testing` (its docstring has an example)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from driftstream.barriers.bundle import Bundle
from driftstream.engine.model.connectors import Sink, SinkPartition, Source, SourcePartition
from driftstream.ordering.meta import Meta


class ListPartition(SourcePartition):
    """Element ``i`` of the source (in partition ``i % partitions``) gets time ``(ts, source, p, i)``:
    ``ts`` is ``i``, or with ``timestamp`` the running max over the partition of
    ``timestamp(element)`` in ms (as a Kafka partition's record timestamps)."""

    def __init__(self, items: Sequence, partition: int, partitions: int, source_id: int, start: Optional[tuple] = None,
                 timestamp: Optional[Callable[[Any], float]] = None) -> None:
        self.items, self.partition, self.step, self.source_id = items, partition, partitions, source_id
        self.timestamp = timestamp
        self.pos = partition if start is None else start[0]
        # the running ts before pos (a replay starts with the one saved at its position)
        self.ts = float("-inf") if start is None or timestamp is None else start[1]
        self.done = self.pos >= len(items)

    def _ts(self, i: int) -> int:
        """Element i's time, given the running ts before it."""
        if self.timestamp is None:
            return i
        return max(self.ts, math.floor(self.timestamp(self.items[i]) * 1000))

    def position(self) -> tuple:
        return (self.pos, self.pos if self.timestamp is None else self.ts)

    def _due(self) -> int:
        return len(self.items)

    def bound(self) -> tuple:
        # The next element has time (ts, source, p, pos): nothing below it is still to come.
        ts = self._ts(self.pos) if self.pos < len(self.items) else (self.pos if self.timestamp is None else self.ts)
        return (ts, self.source_id, self.partition, self.pos - 1)

    def read(self, max_items: int) -> list:
        stop = min(self._due(), self.pos + max_items * self.step)
        if self.pos >= stop:
            return []
        sid, p, items = self.source_id, self.partition, self.items
        if self.timestamp is None:
            out = [((i, sid, p, i, (), False), items[i]) for i in range(self.pos, stop, self.step)]
        else:
            out = []
            for i in range(self.pos, stop, self.step):
                self.ts = self._ts(i)
                out.append(((self.ts, sid, p, i, (), False), items[i]))
        self.pos = out[-1][0][3] + self.step
        self.done = self.pos >= len(items)
        return out


class MemorySource(Source):
    """A bounded source over a list; element ``i`` goes to partition ``i % partitions``.

    ``timestamp(element) -> seconds``: the elements' source time (what event-time windows
    close on by default), as a Kafka record's timestamp; default: the index, as ms.

    >>> [m[0] for m, _ in MemorySource(["a", "b", "c"], partitions=2).open(1, 0).read(10)]
    [1]
    >>> [m[0] for m, _ in MemorySource([3.0, 1.0, 5.0], timestamp=float).open(0, 0).read(10)]   # running max
    [3000, 3000, 5000]
    """

    def __init__(self, items: Iterable, partitions: int = 1, timestamp: Optional[Callable[[Any], float]] = None) -> None:
        if partitions < 1:
            raise ValueError("MemorySource needs partitions >= 1")
        self.items = list(items)
        self._partitions = partitions
        self.timestamp = timestamp

    def partitions(self) -> int:
        return self._partitions

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return ListPartition(self.items, partition, self._partitions, source_id, start, self.timestamp)


class _PacedPartition(ListPartition):
    def __init__(self, items: Sequence, partition: int, partitions: int, source_id: int, rate: float, start: Optional[tuple] = None,
                 timestamp: Optional[Callable[[Any], float]] = None) -> None:
        super().__init__(items, partition, partitions, source_id, start, timestamp)
        self.rate = rate
        self.first = self.pos  # pacing restarts where a replay starts
        self.started: Optional[float] = None

    def _due(self) -> int:
        if self.started is None:
            self.started = time.time()
        return min(len(self.items), self.first + int((time.time() - self.started) * self.rate) + 1)

    def next_ready_in(self) -> Optional[float]:
        if self.started is None or self.done:
            return None
        return max(0.0, self.started + (self.pos - self.first) / self.rate - time.time())


class PacedSource(MemorySource):
    """Like MemorySource, but element ``i`` becomes available ``i / rate`` seconds after the
    partition is first read: a steady input rate for latency measurements.
    The times are still the indexes, so the output does not depend on the pacing.
    """

    def __init__(self, items: Iterable, rate: float, partitions: int = 1, timestamp: Optional[Callable[[Any], float]] = None) -> None:
        super().__init__(items, partitions, timestamp)
        if rate <= 0:
            raise ValueError("PacedSource needs rate > 0 (elements per second)")
        self.rate = rate

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return _PacedPartition(self.items, partition, self._partitions, source_id, self.rate, start, self.timestamp)


class _MemoryPartition(SinkPartition):
    def __init__(self) -> None:
        self.elements: list = []

    def write(self, bundle: Bundle) -> None:
        self.elements.extend(bundle.elements)

    def t_last(self) -> Optional[Meta]:
        return self.elements[-1][0] if self.elements else None

    def collected(self) -> list:
        return self.elements


class MemorySink(Sink):
    """Collects released elements in the actor; the driver gets them as ``result.output(name)``."""

    def open(self, partition: int, partitions: int) -> SinkPartition:
        return _MemoryPartition()
