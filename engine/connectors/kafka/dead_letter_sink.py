"""The sink of a Kafka source's dead letters (``<topic>.dlq``): a :class:`.KafkaSink` that
asks the broker's metadata, after each write, whether the topic is still there.

A broker may accept writes to a deleted topic: Tansu answers them with error 0, and the
letters go nowhere. Letters are few (one write per bundle that holds some), so each write
costs one more short connection (~2 ms); a topic that is gone fails the write, and so the
run, with :class:`.TopicVanished` naming the sink and the topic.

>>> DeadLetterKafkaSink("events.dlq", "127.0.0.1:9092", name="dead_letters")   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.barriers.bundle import Bundle
from driftstream.engine.model.connectors import SinkPartition
from driftstream.engine.connectors.kafka.sink import KafkaSink
from driftstream.engine.connectors.kafka.topic_watch import TopicWatch
from driftstream.ordering.meta import Meta


class DeadLetterKafkaSink(KafkaSink):
    """A :class:`.KafkaSink` whose writes are each followed by a metadata check of its topic."""

    def open(self, partition: int, partitions: int) -> SinkPartition:
        return _CheckedPartition(super().open(partition, partitions),
                                 TopicWatch(self.bootstrap_servers, self.topic, partition, f"sink {self.name!r}", self.security))


class _CheckedPartition(SinkPartition):
    """``inner``'s writes, each followed by ``watch.check()``; the rest is ``inner``'s."""

    def __init__(self, inner: SinkPartition, watch: TopicWatch) -> None:
        self.inner, self.watch = inner, watch

    def write(self, bundle: Bundle) -> None:
        self.inner.write(bundle)
        self.watch.check(f"after the broker took {len(bundle)} records for partition {self.watch.partition}: they went nowhere")

    def t_last(self) -> Optional[Meta]:
        return self.inner.t_last()

    def skip_replayed(self) -> tuple:
        return self.inner.skip_replayed()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # e.g. the writer, for tests and status
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
