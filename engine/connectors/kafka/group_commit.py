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

import logging
import threading
from typing import Optional

from driftstream.engine.connectors.kafka.security import PLAINTEXT, KafkaSecurity

log = logging.getLogger(__name__)


class GroupCommitter:
    """Commits ``{partition: offset}`` of ``topic`` to consumer group ``group``, in the background.

    ``status()``: the offsets last committed, how many commits landed and failed, the last
    failure. O(partitions) per commit.
    """

    def __init__(self, bootstrap_servers: str, topic: str, group: str, security: KafkaSecurity = PLAINTEXT, timeout_s: float = 10.0) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group = group
        self.security = security
        self.timeout_s = timeout_s
        self.committed: dict = {}
        self.commits = 0
        self.failures = 0
        self.last_error: Optional[str] = None
        self._pending: Optional[dict] = None
        self._busy = False
        self._closing = False
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._consumer = None

    def submit(self, offsets: dict) -> None:
        """Commit ``offsets`` soon, unless newer ones come first. Returns at once."""
        if not offsets:
            return
        with self._wake:
            self._pending = dict(offsets)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"kafka-group-commit-{self.group}", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                if self._pending is None:
                    return
                offsets, self._pending, self._busy = self._pending, None, True
            try:
                self._commit(offsets)
                self.committed, self.commits, self.last_error = offsets, self.commits + 1, None
            except Exception as exc:  # any failure: counted, and the next snapshot's offsets try again
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("consumer group %s: offsets of %s not committed (%s); the next snapshot's will be", self.group, self.topic, self.last_error)
                self._drop_consumer()
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

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

    def _drop_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False)
            except Exception:  # a consumer of a broker that is gone: closing it may fail too
                pass

    def status(self) -> dict:
        """For ``status()``: the group, the offsets last committed, commits and failures."""
        return {"group": self.group, "topic": self.topic, "committed": dict(self.committed), "commits": self.commits,
                "failures": self.failures, "last_error": self.last_error}

    def close(self, timeout_s: float = 5.0) -> None:
        """Commit what is pending (waiting up to ``timeout_s``), then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            self._wake.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout_s)
        if self._thread is not None:
            self._thread.join(timeout=0.1)
        if not self._busy:
            self._drop_consumer()
