"""The record of a run's snapshots: the committed ones, those the store failed, and when to
try again after a failure.

After failures in a row the next schedule waits for a backoff (:meth:`SnapshotLog.retry_at`);
how long they have failed decides when the run stops (``snapshot_failure_timeout``).

>>> log = SnapshotLog()
>>> log.fail("OSError: disk full", now=100.0), log.fail("OSError: disk full", now=103.0)
(0.0, 3.0)
>>> log.retry_at(interval=1.0, now=103.0), log.failing_s(now=104.0)   # 1 s doubled once
(105.0, 4.0)
>>> log.add(SnapshotRecord(7, (5, 0, 0, 5), 0.02)); log.failures, log.failures_in_row, log.committed
(2, 0, 1)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

#: A failed snapshot (the store unwritable) is retried after the snapshot interval, doubling
#: at each failure in a row up to this many seconds.
SNAPSHOT_RETRY_MAX_S = 8.0

#: Committed snapshots whose record (id, t, duration) a run keeps for status() and metrics:
#: the last ones; the count is kept apart.
KEEP_SNAPSHOT_RECORDS = 1000


@dataclass
class SnapshotRecord:
    """A committed snapshot; ``duration_s``: from its marker until every part was durable
    (the manifest is committed right after)."""

    snapshot_id: int
    t: tuple
    duration_s: float
    requested_at: float = 0.0
    committed_at: float = 0.0


@dataclass
class SnapshotLog:
    """The snapshots of a run: the last KEEP_SNAPSHOT_RECORDS committed (``committed`` counts
    them all), those the store failed, the last one's error, and since when they fail in a
    row (None: the last one was committed)."""

    records: deque = field(default_factory=lambda: deque(maxlen=KEEP_SNAPSHOT_RECORDS))
    committed: int = 0
    failures: int = 0
    failures_in_row: int = 0
    last_error: Optional[str] = None
    failing_since: Optional[float] = None

    def add(self, record: SnapshotRecord) -> None:
        """``record`` was committed: the failures in a row end."""
        self.records.append(record)
        self.committed += 1
        self.failing_since, self.failures_in_row = None, 0

    def fail(self, error: str, now: float) -> float:
        """A snapshot failed with ``error``; seconds snapshots have failed in a row."""
        self.failures += 1
        self.failures_in_row += 1
        self.last_error = error
        self.failing_since = self.failing_since or now
        return now - self.failing_since

    def retry_at(self, interval: float, now: float) -> float:
        """When to try a snapshot again after failures: ``interval``, doubled per failure in a
        row, at most SNAPSHOT_RETRY_MAX_S."""
        return now + min(SNAPSHOT_RETRY_MAX_S, interval * 2 ** min(10, self.failures_in_row - 1))

    def failing_s(self, now: float) -> float:
        """Seconds snapshots have failed in a row (0: the last one was committed)."""
        return 0.0 if self.failing_since is None else round(now - self.failing_since, 3)
