"""GroupCommitter: a flow's Kafka source offsets, committed to a consumer group for lag monitors.

Lag monitors (``kafka-consumer-groups --describe``, Burrow, exporters) read a consumer
group's committed offsets; a driftstream flow keeps its offsets in its snapshots instead.
With ``KafkaSource(..., commit_group="name")``, after each committed snapshot the offsets
it holds for the source's partitions (where a replay would start: the next record to read,
as Kafka's committed offsets are) are committed to group ``name`` with an OffsetCommit that
joins no group. The flow never reads them back: a replay starts from the snapshot.

Commits run on a thread of their own, the newest snapshot's offsets first (an older one's
are dropped, never committed after a newer one's), each bounded by ``timeout_s``: a broker
that is down costs the supervisor nothing, and a failed commit is counted and superseded
by the next snapshot's.

>>> c = GroupCommitter("127.0.0.1:9092", "events", "events-lag")    # doctest: +SKIP
>>> c.submit({0: 120, 1: 98}); c.close(timeout_s=5)                  # doctest: +SKIP
"""

from __future__ import annotations

from driftstream.engine.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from driftstream.engine.connectors.newest_commit import NewestCommitter


class GroupCommitter(NewestCommitter):
    """Commits ``{partition: offset}`` of ``topic`` to consumer group ``group``, in the background
    (:class:`~driftstream.engine.connectors.newest_commit.NewestCommitter`).

    ``status()``: the offsets last committed, how many commits landed and failed, the last
    failure. O(partitions) per commit.
    """

    def __init__(self, bootstrap_servers: str, topic: str, group: str, security: KafkaSecurity = PLAINTEXT, timeout_s: float = 10.0) -> None:
        super().__init__(f"kafka-group-commit-{group}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group = group
        self.security = security
        self.timeout_s = timeout_s
        self._consumer = None

    def describe(self) -> dict:
        return {"group": self.group, "topic": self.topic}

    def _commit(self, offsets: dict) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        if self._consumer is None:
            timeout_ms = int(self.timeout_s * 1000)
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=self.group, enable_auto_commit=False,
                                           client_id=f"driftstream-group-commit-{self.group}", bootstrap_timeout_ms=timeout_ms,
                                           request_timeout_ms=timeout_ms, **self.security.client_settings())
        self._consumer.commit({TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()},
                              timeout_ms=int(self.timeout_s * 1000))

    def _reset(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False)
            except Exception:  # a consumer of a broker that is gone: closing it may fail too
                pass
