"""The connector contract: what a source and a sink are to the engine, in one place.

A source has partitions, each read by exactly one source instance (the partitions ``p``
with ``p % instances == instance``, see :mod:`driftstream.engine.connectors.source_reader`).
A partition produces elements with their Meta already set from durable data only (an index,
a Kafka offset and timestamp), so a replay reproduces the same times.

A sink is declared once in the flow; each barrier opens its own partition of it. A partition
acknowledges a bundle by returning from ``write`` (only then does the barrier send the next
one) and can say which element it holds last (``t_last``), which is what exactly-once
recovery filters replayed output with. The connectors themselves live in
:mod:`driftstream.engine.connectors`; a sink whose writes may fail for a while retries them
with :class:`~driftstream.engine.connectors.retrying_writer.RetryingWriter`.

Here, in ``model/``, because the plan and every room above it name these types, and they
need nothing but the pure core (a Meta, a Bundle): the barrier's release logic in
``driftstream.barriers`` never sees a sink (the runtime hands it the bundles).

>>> class PrintSink(Sink):
...     def open(self, partition, partitions):
...         return PrintPartition()
>>> class PrintPartition(SinkPartition):
...     def write(self, bundle):
...         print(bundle.payloads())
>>> part = PrintSink("console").open(0, 1)
>>> part.write(Bundle([(Meta(1, 0, 0, 1), "hello")]))
['hello']
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Optional, Protocol

from driftstream.barriers.bundle import Bundle
from driftstream.ordering.meta import Meta, Time


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


class SinkPartition(ABC):
    """One partition of a sink, written by exactly one barrier."""

    @abstractmethod
    def write(self, bundle: Bundle) -> None:
        """Make the bundle durable (or visible); returning acknowledges it."""

    def t_last(self) -> Optional[Meta]:
        """``t_last``: the Meta of the last element this partition durably holds, or None if
        unknown or empty. Exactly-once recovery drops replayed output at or before it."""
        if type(self).last_bundle is not SinkPartition.last_bundle:
            return self.last_bundle()  # a sink written against the old name
        return None

    def skip_replayed(self) -> tuple:
        """Recovery under exactly-once or at-most-once: ``(t_last, drop_through)``, where the
        barrier drops replayed elements at or before ``drop_through``. Default: both
        :meth:`t_last`. A partition made of parts each written in t order (a keyed
        :class:`.KafkaSink`'s Kafka partitions) has the latest part's as ``t_last`` and drops per
        part itself: the barrier's ``drop_through`` is then one every part holds, or None."""
        t_last = self.t_last()
        return t_last, t_last

    def last_bundle(self) -> Optional[Meta]:
        """The old name of :meth:`t_last` (deprecated): a sink that overrides only this still works."""
        return self.t_last()

    def collected(self) -> Optional[list]:
        """For in-memory sinks: the ``(meta, payload)`` pairs written, handed back to the driver."""
        return None

    def close(self) -> None:
        """Release resources; called once when the run ends."""


class Sink(ABC):
    """A named output of a flow. Subclasses open one partition per barrier."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a sink needs a non-empty str name")
        self.name = name

    @abstractmethod
    def open(self, partition: int, partitions: int) -> SinkPartition:
        """Open partition ``partition`` of ``partitions`` (one per barrier)."""

    def partition_key(self, max_parallelism: int) -> Optional[Callable[[Any], Any]]:
        """A ``key_by`` function the flow routes this sink's input by, so that each part of the
        destination has one writer at any parallelism (a keyed Kafka sink: element -> its
        Kafka partition's routing key); None (the default): each barrier writes its own part,
        the input stays where it is. ``max_parallelism``: the flow's."""
        return None

    def check(self, partitions: int) -> None:
        """Before any instance of a run starts: raise (a ValueError saying what to do) if this
        sink cannot take ``partitions`` partitions, e.g. a topic with fewer. Default: it can."""
