"""A partition's time, read from its records' timestamps, that one far-off clock cannot move.

A source partition's time is the running maximum of its records' timestamps: a function
of the log alone, so a replay reproduces it. Alone, that rule lets one record stamped a
year ahead (a producer with a broken clock) move the partition's time for good, and with
it every window and timer downstream.

:class:`PartitionClock` bounds it without the wall clock (which a replay would read
differently): a record more than ``max_jump_ms`` ahead of the partition's time is held
until the next record decides. If the next one is within ``max_jump_ms`` of it, time did
jump (a producer back after a long pause) and both keep their timestamps; if not, the
held record is an outlier: it is stamped with the partition's time, counted, and its
partition's time stays. A partition's first record is judged the same way against the
one after it. At the end of a bounded partition a held record keeps its timestamp.

The cost: a record that jumps waits for the next one (on a live Kafka partition the
source's tick, within its ``tick_interval``, if no record comes). Two outliers in a row
look like a jump; that is the limit of a rule that reads only the log.
"""

from __future__ import annotations

from typing import Any, Optional


class PartitionClock:
    """Stamps each record of a partition with its time, in order: :meth:`offer` takes a
    record's timestamp and the record, and gives back ``(record, stamp)`` for those it
    releases.

    >>> clock = PartitionClock(ts=100, max_jump_ms=1_000)
    >>> clock.offer(105, "a"), clock.offer(10**12, "b"), clock.offer(107, "c")   # b: an outlier
    ([('a', 105)], [], [('b', 105), ('c', 107)])
    >>> clock.ts, clock.clamped
    (107, 1)
    >>> clock.offer(50_000, "d"), clock.offer(50_010, "e")                       # a jump, confirmed
    ([], [('d', 50000), ('e', 50010)])
    """

    __slots__ = ("ts", "max_jump_ms", "clamped", "_held", "held")

    def __init__(self, ts: Optional[int] = None, max_jump_ms: Optional[int] = None) -> None:
        self.ts = ts  # the partition's time: the last released stamp (None before the first)
        self.max_jump_ms = max_jump_ms  # None: the plain running maximum
        self.clamped = 0  # outliers stamped with the partition's time
        self._held: Optional[int] = None  # the timestamp of the record waiting for the next one
        self.held: Any = None  # that record (a replay must start at it)

    @property
    def holding(self) -> bool:
        """True while a record waits for the next one to decide its time."""
        return self._held is not None

    def offer(self, timestamp: int, record: Any = None) -> list:
        """``(record, stamp)`` for each record this one releases, in order: none while it is
        held; its own; or the held record's and then its own (or only the held one's, if
        this one is held in turn). O(1).

        >>> PartitionClock(None, 10).offer(5), PartitionClock(None, None).offer(5)
        ([], [(None, 5)])
        """
        out: list = []
        held = self._held
        if held is not None:
            if timestamp < held - self.max_jump_ms:  # the next record does not follow it: an outlier
                self.clamped += 1
                if self.ts is None:
                    self.ts = timestamp
            elif self.ts is None or held > self.ts:
                self.ts = held
            out.append((self.held, self.ts))
            self._held = self.held = None
        if self.max_jump_ms is not None and (self.ts is None or timestamp - self.ts > self.max_jump_ms):
            self._held, self.held = timestamp, record
            return out
        if self.ts is None or timestamp > self.ts:
            self.ts = timestamp
        out.append((record, self.ts))
        return out

    def finish(self) -> list:
        """The end of a bounded partition: ``[(held record, its own timestamp)]`` (nothing
        follows to say otherwise), or ``[]`` if none is held.

        >>> clock = PartitionClock(100, 10)
        >>> clock.offer(500, "last"), clock.finish()
        ([], [('last', 500)])
        """
        held = self._held
        if held is None:
            return []
        if self.ts is None or held > self.ts:
            self.ts = held
        out = [(self.held, self.ts)]
        self._held = self.held = None
        return out
