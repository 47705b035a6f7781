"""Sink interfaces: where a barrier's bundles go.

A sink is declared once in the flow; each barrier opens its own partition of it.
A partition acknowledges a bundle by returning from ``write`` (only then does the
barrier send the next one) and can say which bundle it has last (``t_last``),
which is what exactly-once recovery filters replayed output with.

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
from typing import Any, Callable, Optional

from driftstream.ordering.meta import Meta

from .bundle import Bundle


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
