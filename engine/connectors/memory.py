"""In-memory sources and sinks: for tests, examples and the simulator. Users import them
from :mod:`driftstream.engine.testing` (its docstring has an example)."""

from __future__ import annotations

import time
from typing import Iterable, Optional, Sequence

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.sink import Sink, SinkPartition
from driftstream.ordering.meta import Meta

from driftstream.engine.connectors.source import Source, SourcePartition


class ListPartition(SourcePartition):
    """Element ``i`` of the source (in partition ``i % partitions``) gets time ``(i, source, p, i)``."""

    def __init__(self, items: Sequence, partition: int, partitions: int, source_id: int, start: Optional[tuple] = None) -> None:
        self.items, self.partition, self.step, self.source_id = items, partition, partitions, source_id
        self.pos = partition if start is None else start[0]
        self.done = self.pos >= len(items)

    def position(self) -> tuple:
        return (self.pos, self.pos)

    def _due(self) -> int:
        return len(self.items)

    def bound(self) -> tuple:
        # The next element has time (pos, source, p, pos): nothing below it is still to come.
        return (self.pos, self.source_id, self.partition, self.pos - 1)

    def read(self, max_items: int) -> list:
        stop = min(self._due(), self.pos + max_items * self.step)
        if self.pos >= stop:
            return []
        sid, p, items = self.source_id, self.partition, self.items
        out = [((i, sid, p, i, (), False), items[i]) for i in range(self.pos, stop, self.step)]
        self.pos = out[-1][0][3] + self.step
        self.done = self.pos >= len(items)
        return out


class MemorySource(Source):
    """A bounded source over a list; element ``i`` goes to partition ``i % partitions``.

    >>> [m[0] for m, _ in MemorySource(["a", "b", "c"], partitions=2).open(1, 0).read(10)]
    [1]
    """

    def __init__(self, items: Iterable, partitions: int = 1) -> None:
        if partitions < 1:
            raise ValueError("MemorySource needs partitions >= 1")
        self.items = list(items)
        self._partitions = partitions

    def partitions(self) -> int:
        return self._partitions

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return ListPartition(self.items, partition, self._partitions, source_id, start)


class _PacedPartition(ListPartition):
    def __init__(self, items: Sequence, partition: int, partitions: int, source_id: int, rate: float, start: Optional[tuple] = None) -> None:
        super().__init__(items, partition, partitions, source_id, start)
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

    def __init__(self, items: Iterable, rate: float, partitions: int = 1) -> None:
        super().__init__(items, partitions)
        if rate <= 0:
            raise ValueError("PacedSource needs rate > 0 (elements per second)")
        self.rate = rate

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return _PacedPartition(self.items, partition, self._partitions, source_id, self.rate, start)


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
