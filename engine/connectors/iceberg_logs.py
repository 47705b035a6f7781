"""pyiceberg's per-attempt warning of a commit that lost a race, quieted to DEBUG.

An IcebergSink's partitions commit to one table concurrently, so a commit that loses the
race to another partition's (Iceberg's optimistic concurrency) is expected, not a fault:
pyiceberg retries it on the refreshed table (``commit.retry.num-retries``) and logs each
attempt at WARNING ("Commit failed due to a concurrent update, retrying (1/4) in 104 ms"),
a line per partition per second on a busy run. That record, and only that one, is demoted
to DEBUG: shown where DEBUG is on for pyiceberg, dropped otherwise. A commit that still
fails reaches the sink, whose own retry policy says so, once.
"""

from __future__ import annotations

import logging

#: The pyiceberg logger of the transaction's commit retries.
PYICEBERG_COMMIT_LOGGER = "pyiceberg.table"
#: How that warning begins (pyiceberg 0.9 and later).
CONCURRENT_UPDATE = "Commit failed due to a concurrent update"


class ConcurrentCommitToDebug(logging.Filter):
    """Turns pyiceberg's concurrent-update retry warning into a DEBUG record; other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not str(record.msg).startswith(CONCURRENT_UPDATE):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        # The logger let it through as a WARNING: pass it on only where DEBUG is on, as a DEBUG record would be.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_FILTER = ConcurrentCommitToDebug()


def quiet_concurrent_commit_warnings() -> None:
    """Install the filter on pyiceberg's logger (once per process; idempotent)."""
    logger = logging.getLogger(PYICEBERG_COMMIT_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
