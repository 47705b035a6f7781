"""Source interfaces: a source has partitions, each read by exactly one source instance.

A source has partitions; each source instance reads the partitions
``p`` with ``p % instances == instance`` (see :mod:`.source_reader`). A partition
produces elements with their Meta already set from durable data only (an index, a
Kafka offset and timestamp), so a replay reproduces the same times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Protocol

from driftstream.ordering.meta import Time


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

    def position(self) -> tuple:
        """``(next offset, running ts)``: where a replay of what this partition has not read yet starts."""
        raise NotImplementedError(f"{type(self).__name__} cannot be replayed: it has no position()")

    def bound(self) -> Optional[Time]:
        """A time below every element this partition will still produce, if it knows one
        from durable data (e.g. the next index of a list). None: the reader uses the
        time of the last element read, which is always safe but waits for the next one.
        """
        return None

    def skip_after(self, t: Time) -> int:
        """At-most-once recovery: replay only up to time ``t`` (the last released output),
        then jump to the live end of the partition, skipping what lies between.
        Returns the number of records skipped. Default: the partition cannot tell a
        live end, skips nothing, and the replay goes on as under exactly-once."""
        return 0

    def lag(self) -> Optional[int]:
        """Records the partition holds beyond what was read, if it knows (Kafka: from the
        last fetch's high watermark, no broker call). None: unknown."""
        return None

    def fetch_state(self) -> Optional[dict]:
        """How reading this partition goes, for ``status()`` (Kafka: the broker's answer
        times and why the partition is behind); None: nothing to say."""
        return None

    def close(self) -> None:
        """Release resources."""


class CommitHook(Protocol):
    """Told, on the driver, the positions each committed snapshot holds for a source's
    partitions (e.g. :class:`~driftstream.engine.connectors.kafka.group_commit.GroupCommitter`).
    ``submit`` must return at once: the supervisor calls it in its loop."""

    def submit(self, offsets: dict) -> None:
        """``{partition: next offset}`` of the snapshot just committed."""

    def status(self) -> dict:
        """What ``status()`` shows of it."""

    def close(self, timeout_s: float) -> None:
        """Finish what is pending within ``timeout_s``, then stop."""


class Source(ABC):
    """A named input of a flow. ``bounded`` sources end; unbounded ones run until stopped."""

    bounded: bool = True
    #: True when the ``ts`` of its times is a wall-clock timestamp in epoch milliseconds
    #: (Kafka record timestamps): ``status()`` then tells how far the watermark is behind now
    epoch_ms_times: bool = False
    #: True when its partitions may read records they cannot decode: they emit them as
    #: :class:`~driftstream.engine.model.errors.DeadLetter` elements at their own t, and the
    #: flow sends these to its dead-letter sink, exactly once under exactly-once
    emits_dead_letters: bool = False
    #: how far past the slowest of its partitions (in its time units) a partition reads under
    #: ``source_alignment="auto"`` (see engine/connectors/alignment.py); None: not aligned
    alignment_slack: Optional[float] = None
    #: the flow step that reads it (set by ``Flow.source``): its dead letters name it
    step_name: str = "source"

    @abstractmethod
    def partitions(self) -> int:
        """How many partitions the source has."""

    @abstractmethod
    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        """Open one partition; ``source_id`` is the Meta ``source`` field to stamp.

        ``start``: a :meth:`SourcePartition.position` saved by a snapshot; the partition
        then re-emits exactly the elements from there on, with the same times.
        """

    def commit_hook(self) -> Optional[CommitHook]:
        """What to tell each committed snapshot's positions of this source, on the driver
        (Kafka: a consumer group to commit them to); None (default): nothing."""
        return None
