"""Whether a topic a connector reads or writes is still there, asked of the broker's metadata.

A topic deleted while a flow runs does not always say so in the answers to fetches and
writes: Tansu answers a fetch of a deleted topic's partition with error 0 and a high
watermark of 0 (which a reader past offset 0 would take for "caught up" for ever), and
accepts writes to it with error 0 (they go nowhere). Apache Kafka answers
``UNKNOWN_TOPIC_OR_PARTITION``, which a client takes for a leader move and retries. So a
reader whose partition's log ends below where it has read, a writer after its writes,
and either after an error, ask the metadata: :class:`TopicWatch` raises
:class:`TopicVanished` naming the connector, the topic and what happened.

>>> watch = TopicWatch("127.0.0.1:9092", "docs", 3, "KafkaSource 'events'")   # doctest: +SKIP
>>> watch.check()                                                             # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import kafka.errors as kafka_errors

from driftstream.engine.connectors.kafka.security import PLAINTEXT, REFUSED, KafkaSecurity
from driftstream.engine.connectors.kafka.wire import BrokerConnection, split_host_port, topic_metadata

#: Seconds one metadata request may take per bootstrap server.
METADATA_TIMEOUT_S = 5.0

#: ``UNKNOWN_TOPIC_OR_PARTITION``: the broker does not have the topic.
UNKNOWN_TOPIC = kafka_errors.UnknownTopicOrPartitionError.errno


class TopicVanished(RuntimeError):
    """A topic a connector reads or writes was deleted (or recreated smaller, or its log cut
    below what was read) while the flow ran: no retry brings its records back."""


@dataclass(frozen=True)
class TopicState:
    """What the metadata says of a topic: ``partitions`` (0: the broker does not have it)."""

    partitions: int

    @property
    def exists(self) -> bool:
        return self.partitions > 0


def topic_state(bootstrap_servers: str, topic: str, security: KafkaSecurity = PLAINTEXT,
                timeout_s: float = METADATA_TIMEOUT_S) -> Optional[TopicState]:
    """The metadata of ``topic`` from the first bootstrap server that answers (without
    creating it: ``allow_auto_topic_creation=False``), or None when none answered (then
    nothing is known: the caller's own retries go on). One connection, ~2 ms."""
    for server in bootstrap_servers.split(","):
        try:
            host, port = split_host_port(server)
            conn = BrokerConnection(host, port, "driftstream-topic-watch", timeout_s, security)
        except REFUSED:
            raise
        except (OSError, ValueError):
            continue
        try:
            _, metadata = topic_metadata(conn, topic)
        except REFUSED:
            raise
        except (OSError, kafka_errors.KafkaError):
            continue
        finally:
            conn.close()
        for t in metadata.topics:
            if t.name == topic:
                return TopicState(0 if t.error_code == UNKNOWN_TOPIC else len(t.partitions))
        return TopicState(0)
    return None


class TopicWatch:
    """Asks the metadata whether partition ``partition`` of ``topic`` still exists, for
    ``what`` (the connector, as errors name it). :meth:`check` raises
    :class:`TopicVanished` if it does not; :meth:`due` says whether ``every_s`` passed
    since the last check (a periodic check costs one short connection)."""

    def __init__(self, bootstrap_servers: str, topic: str, partition: int, what: str, security: KafkaSecurity = PLAINTEXT,
                 every_s: float = 5.0) -> None:
        self.bootstrap_servers, self.topic, self.partition, self.what = bootstrap_servers, topic, partition, what
        self.security = security
        self.every_s = every_s
        self.checked_at = time.monotonic()
        self.checks = 0

    def due(self) -> bool:
        return time.monotonic() - self.checked_at >= self.every_s

    def check(self, doing: str = "") -> None:
        """Raise :class:`TopicVanished` if the topic is gone or has no partition
        ``partition`` any more; nothing when it is there or no broker answered."""
        self.checked_at = time.monotonic()
        self.checks += 1
        state = topic_state(self.bootstrap_servers, self.topic, self.security)
        if state is None or state.partitions > self.partition:
            return
        where = f" ({doing})" if doing else ""
        if not state.exists:
            raise TopicVanished(f"{self.what}: topic {self.topic!r} does not exist any more at {self.bootstrap_servers}{where}: "
                                "it was deleted while the flow ran. Recreate it (records it held are gone) and start the flow "
                                "again, or stop the flow")
        raise TopicVanished(f"{self.what}: topic {self.topic!r} at {self.bootstrap_servers} has {state.partitions} partitions now, "
                            f"but the flow uses partition {self.partition}{where}: it was recreated with fewer while the flow "
                            "ran. Add partitions back (records of the old ones are gone) and start the flow again, or stop it")

    def truncated(self, end: int, offset: int) -> TopicVanished:
        """The error for a partition whose log ends at ``end``, below ``offset``, which the
        reader had reached, while the topic exists (:meth:`check` found it)."""
        return TopicVanished(f"{self.what}: partition {self.partition} of topic {self.topic!r} at {self.bootstrap_servers} ends at "
                             f"offset {end}, below offset {offset} the flow had read to: the topic was deleted and recreated "
                             "(or its records deleted) while the flow ran, and a snapshot's offsets no longer point at the same "
                             "records. Start the flow again without resume (fresh=True) to read the new topic from its start")


class LogWatch:
    """A reader's use of :class:`TopicWatch`: after each fetch that found nothing,
    :meth:`idle` raises :class:`TopicVanished` if the log has ended below the reader's
    offset for ``end_below_s`` and the topic is gone or the log no longer holds the last
    record read (then a recreated topic, not an end reported short), or, every
    ``topic.every_s`` while caught up, if the metadata says the topic is gone."""

    def __init__(self, topic: TopicWatch, end_below_s: float) -> None:
        self.topic = topic
        self.end_below_s = end_below_s
        self._below_since: Optional[float] = None

    def reading(self) -> None:
        """A fetch returned records: the log does not end below the reader."""
        self._below_since = None

    def idle(self, log_: Any, caught_up: bool) -> None:
        """After a fetch of ``log_`` (a :class:`.PartitionLog`) that found nothing."""
        if log_.end_below is None:
            self._below_since = None
            if caught_up and self.topic.due():
                self.topic.check("while its partition was idle")
            return
        now = time.monotonic()
        if self._below_since is None:
            self._below_since = now
        if now - self._below_since < self.end_below_s:
            return
        end, offset = log_.end_below, log_.next_offset
        self.topic.check(f"partition {self.topic.partition} ends at offset {end}, below offset {offset} the flow had read to")
        if log_.holds(offset - 1) is False:
            raise self.topic.truncated(end, offset)
        self._below_since = None  # the end was only reported short: look again later

    def refine(self, exc: BaseException) -> BaseException:
        """``exc`` (a fetch's broker error), or :class:`TopicVanished` caused by it if the
        topic is gone: Apache Kafka answers a deleted topic's fetches as if its leader moved."""
        if isinstance(exc, TopicVanished) or not isinstance(exc, (kafka_errors.KafkaError, OSError)):
            return exc
        try:
            self.topic.check(f"after {exc!r}")
        except TopicVanished as gone:
            gone.__cause__ = exc
            return gone
        except Exception:  # noqa: BLE001 - the metadata is no better reachable: the first error stands
            pass
        return exc
