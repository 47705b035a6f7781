"""A keyed :class:`.KafkaSink`'s barrier partition: it writes the Kafka partitions of the keys
routed to it, each record in the partition Kafka's default partitioner gives its key.

The flow puts a shuffle before a keyed sink (``KafkaSink.partition_key``): every element of
Kafka partition ``p`` reaches the one instance that owns ``p``'s routing key, whatever the
parallelism. So a Kafka partition has one writer at a time, and that writer's barrier
releases in t order: each partition holds its elements in t order, and after any failure
or rescale it holds exactly those at or before its last message's Meta (its ``t_last``;
a bundle that was only partly written still left a prefix).

Recovery (exactly-once, at-most-once) therefore drops replayed elements per Kafka partition:
an element of ``p`` at or before ``t_last(p)`` is there already. The barrier itself drops
only what every partition holds (the earliest ``t_last``), and the ``t_last`` it reports
(drain checks, at-most-once's replay limit) is the latest, the newest output the topic holds.

>>> part = KafkaSink("counts", bs, key=lambda c: c["k"]).open(0, 2)   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from driftstream.barriers.bundle import Bundle
from driftstream.engine.model.connectors import SinkPartition
from driftstream.ordering.meta import Meta

from driftstream.engine.connectors.kafka.partitioner import fast_murmur2, key_bytes
from driftstream.engine.connectors.kafka.sink_partition import KafkaSinkPartition, sink_records
from driftstream.engine.model.errors import short_repr


@dataclass
class KeyedBundle(Bundle):
    """The part of a bundle that goes to one Kafka partition, with each element's key bytes."""

    keys: list = field(default_factory=list)


class _KeyedPartWriter(KafkaSinkPartition):
    """One Kafka partition of a keyed sink: :class:`.KafkaSinkPartition`'s writes (retries
    that read the partition back and write only what did not land), with each record's key."""

    def _records(self, bundle: KeyedBundle) -> Iterator[tuple]:
        records = sink_records(bundle.elements, self.sink.encode, self.sink.name)
        return [(value, headers, key) for (value, headers), key in zip(records, bundle.keys)]


class KeyedKafkaSinkPartition(SinkPartition):
    """What one barrier of a keyed :class:`.KafkaSink` writes: per Kafka partition its elements
    fall in, a :class:`_KeyedPartWriter` (opened at first use) writes them in t order.

    Costs: ``write`` O(elements): the key, its murmur2 (in C) and the split on top of the
    unkeyed sink's encoding, one produce request chain per Kafka partition touched; :meth:`t_last` and :meth:`skip_replayed` read each partition's last message.
    """

    def __init__(self, sink: "KafkaSink") -> None:
        self.sink = sink
        self.partitions = sink.partition_count()
        self._parts: dict = {}  # Kafka partition -> _KeyedPartWriter
        # After a recovery: Kafka partition -> the Meta of its last message. A replayed element
        # at or before it is there already; a partition leaves once it is written past it.
        self._held: dict = {}
        self.dropped_replayed = 0

    def _part(self, p: int) -> _KeyedPartWriter:
        part = self._parts.get(p)
        if part is None:
            part = self._parts[p] = _KeyedPartWriter(self.sink, p)
        return part

    def split(self, bundle: Bundle) -> dict:
        """``bundle``'s elements by Kafka partition: ``{p: (elements, their key bytes)}``, in t order."""
        parts: dict = {}
        key, n, name = self.sink.key, self.partitions, self.sink.name
        for element in bundle.elements:
            try:
                kb = key(element[1])
                kb = kb.encode() if type(kb) is str else key_bytes(kb)  # a str key inline: most are
            except Exception as exc:
                raise TypeError(f"sink {name!r}: key= of {short_repr(element[1])} at t={element[0]!r}: {exc}") from exc
            p = (fast_murmur2(kb) & 0x7FFFFFFF) % n
            part = parts.get(p)
            if part is None:
                part = parts[p] = ([], [])
            part[0].append(element)
            part[1].append(kb)
        return parts

    def write(self, bundle: Bundle) -> None:
        """Write each Kafka partition's part of ``bundle``, one after the other; returns once all
        have landed. A failure leaves some written: the recovery's per-partition filter knows."""
        held = self._held
        for p, (elements, keys) in self.split(bundle).items():
            if held and (last := held.get(p)) is not None:
                keep = [i for i, e in enumerate(elements) if e[0] > last]
                self.dropped_replayed += len(elements) - len(keep)
                if not keep:
                    continue
                del held[p]  # the barrier releases in t order: what follows is past it too
                elements, keys = [elements[i] for i in keep], [keys[i] for i in keep]
            self._part(p).write(KeyedBundle(elements, keys=keys))

    def t_lasts(self) -> dict:
        """Each Kafka partition's last message's Meta (None: empty), read from the broker."""
        return {p: self._part(p).t_last() for p in range(self.partitions)}

    def t_last(self) -> Optional[Meta]:
        """The latest Meta over the topic's partitions: the newest output this sink holds. Each
        instance says the same (any of them may have written any partition before a rescale)."""
        known = [t for t in self.t_lasts().values() if t is not None]
        return max(known) if known else None

    def skip_replayed(self) -> tuple:
        """``(latest t_last, earliest t_last)``: the barrier drops what every partition holds (None
        when a partition is empty); from now on :meth:`write` drops, per Kafka partition, what
        that partition holds."""
        lasts = self.t_lasts()
        self._held = {p: t for p, t in lasts.items() if t is not None}
        known = list(self._held.values())
        return (max(known) if known else None), (min(known) if len(known) == len(lasts) else None)

    def close(self) -> None:
        for part in self._parts.values():
            part.close()
