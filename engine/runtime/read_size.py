"""How many records a source instance reads at a time: as many as make about
:data:`WORK_PER_READ` items of work in its stage, at most ``batch_size``.

A read's records run through the stage's steps in one call, and its keyed steps fold what
the watermark settles only once the acker has heard of the whole read. So what a read makes
is what their logs hold when they fold: a read of 256 Wikipedia documents makes ~38,000
items in the inverted index's fused stage (a word change per distinct word of each page,
through the index step and the sink), the logs held ~25,000 entries at each fold, and
folding cost 4-5 µs an entry against ~2 µs at ~1,000 (dicts that no longer fit the caches).
A read of 1:1 records (Nexmark's events through three steps) keeps its 256.

The size adapts to what reads made, as a running mean of the items per record, so a stage
whose documents vary in length keeps its reads' work about even. Deterministic output does
not depend on it: how much is read at a time changes batching, never the order (``t``).

>>> size = ReadSize(256)
>>> size.next
256
>>> size.made(256, 38_000)           # documents that make ~150 items each
>>> size.next
6
>>> for _ in range(8):
...     size.made(size.next, size.next * 3)   # then records of 3 items each
>>> size.next
256

Costs: O(1) per read.
"""

from __future__ import annotations

#: Items of work (elements taken by the stage's steps, summed) a read aims at.
WORK_PER_READ = 1_024

#: The fewest records a read asks for, however much each makes.
MIN_READ = 2

#: Weight of the newest read in the running mean of items per record.
NEWEST_WEIGHT = 0.5


class ReadSize:
    """The next read's size for a source of ``batch_size`` records at most."""

    __slots__ = ("batch_size", "per_record", "next")

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        #: running mean of the stage's items of work per record read (None: nothing read yet)
        self.per_record: float | None = None
        self.next = batch_size

    def made(self, records: int, work: int) -> None:
        """A read of ``records`` records made ``work`` items of work in the stage."""
        if records <= 0:
            return
        now = work / records
        mean = now if self.per_record is None else self.per_record + NEWEST_WEIGHT * (now - self.per_record)
        self.per_record = mean
        self.next = self.batch_size if mean <= 0 else min(self.batch_size, max(MIN_READ, int(WORK_PER_READ / mean)))
