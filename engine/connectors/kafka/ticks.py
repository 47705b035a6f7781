"""Tick records: what a Kafka source appends to an idle partition to move its time on
through the log (a replay reads the same ticks, so it sees the same times).

A tick is a record with no key, an empty value and one :data:`TICK_HEADER` header holding
:data:`TICK_MARK`, so a user's record that happens to carry a header of that name is still
read; ticks written before the mark carry ``b"1"`` and are still recognised.

>>> from types import SimpleNamespace as R
>>> is_tick(R(key=None, value=b"", headers=[(TICK_HEADER, TICK_MARK)])), is_tick(R(key=None, value=b"{}", headers=[(TICK_HEADER, b"1")]))
(True, False)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import kafka.errors as kafka_errors

from driftstream.engine.connectors.kafka.topic_watch import TopicWatch
from driftstream.engine.connectors.kafka.wire import PartitionWriter

log = logging.getLogger(__name__)

#: Header that marks a tick record: appended to keep an idle partition's time moving; never reaches user code.
TICK_HEADER = "driftstream-tick"

#: The tick header's value the engine writes (see the module docstring).
TICK_MARK = b"\x00driftstream:tick:2\x00"
_TICK_MARKS = (TICK_MARK, b"1")


def is_tick(rec: Any) -> bool:
    """True for a tick the engine appended (see the module docstring). O(1)."""
    headers = rec.headers
    return (bool(headers) and len(headers) == 1 and headers[0][0] == TICK_HEADER and headers[0][1] in _TICK_MARKS
            and rec.value == b"" and rec.key is None)


class PartitionTicker:
    """Appends ticks to partition ``partition`` of ``source``'s topic (from the reader's
    fetcher thread). ``sent``: the ticks appended.

    A tick that fails is only a tick: the next one will do, and ticks are idempotent (they
    only move time), so one that did land is harmless. But a failure asks ``watch`` whether
    the topic is gone (:class:`.TopicVanished`), and ticks failing for the source's
    ``broker_timeout_s`` raise the broker's error: the run fails rather than stall.
    """

    def __init__(self, source: Any, partition: int, watch: TopicWatch) -> None:
        self.source, self.partition, self.watch = source, partition, watch
        self.writer: Optional[PartitionWriter] = None
        self.sent = 0
        self._failing_since: Optional[float] = None

    def tick(self) -> None:
        src = self.source
        try:
            if self.writer is None:
                self.writer = PartitionWriter(src.bootstrap_servers, src.topic, self.partition, client_id="driftstream-tick",
                                              security=src.security)
            self.writer.write([(b"", [(TICK_HEADER, TICK_MARK)])])
            self.sent += 1
            self._failing_since = None
        except (kafka_errors.KafkaError, OSError) as exc:
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            self.watch.check(f"a tick was not appended: {exc!r}")
            if now - self._failing_since > src.broker_timeout_s:
                raise kafka_errors.KafkaConnectionError(
                    f"KafkaSource {src.step_name!r}: ticks to {src.topic}[{self.partition}] failed for {src.broker_timeout_s:g} s "
                    f"(broker_timeout_s): {exc!r}") from exc
            log.warning("%s[%d]: a tick was not appended: %r", src.topic, self.partition, exc)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
