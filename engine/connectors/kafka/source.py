"""KafkaSource: a replayable source whose times come from the log alone.

Partition ``p`` of the topic is read by source instance ``p % instances``. An
element's time is ``(ts, source, p, offset)`` where ``ts`` is the running
maximum of record timestamps in the partition: a function of the log prefix,
so a replay from any offset (with the running ts saved there) reproduces it.
A record far ahead of its partition's time that the next record does not confirm is
stamped with the partition's time instead (``max_time_jump_s``, :mod:`.partition_clock`).

Transactional input is read ``read_committed`` by default, as Kafka's consumers and
Flink's source read it: up to the last stable offset, without the records of aborted
transactions, stepping over transaction markers (:mod:`.partition_log`,
:mod:`.transactions`); ``isolation="read_uncommitted"`` reads every record. Batches
compressed with any of Kafka's codecs are read (:mod:`.codecs`).

A broker may make a later batch visible before an earlier one: Tansu assigns a
batch its offsets before it stores it, so with two producers on a partition (the
source's own ticks and the user's) a fetch can return offset 12 while 11 is still
being stored. A reader that moved on would lose record 11 for good. The reader
therefore waits, up to ``gap_wait_s``, for a hole in the offsets to fill
(:class:`.OffsetGaps`); a hole that stays (compaction) is skipped and logged.

Records that cannot be decoded (bad JSON, a decoder that raises, a null value) become
dead letters at their own t (:class:`.BadRecord`: where the record is, its key and value,
cut at 64 KiB): the flow's dead-letter sink (by default a KafkaSink to ``<topic>.dlq``)
writes them through its barrier, exactly once under exactly-once; they are counted
per source step and do not stop the flow. Values are
decoded as JSON or passed on as bytes; never unpickled.

A secured broker: ``security=KafkaSecurity(...)``, or kafka-python's settings as keyword
arguments (``security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", ...``); every
client the source opens uses them (:mod:`.security`).

>>> src = KafkaSource("docs", "127.0.0.1:9092")             # doctest: +SKIP
>>> flow.source(src).map(lambda doc: doc["title"])          # doctest: +SKIP
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any, Callable, Optional, Union

from kafka import TopicPartition

from driftstream.engine.model.errors import DeadLetter, FlowError, dead_letter, short_repr
from driftstream.engine.connectors.kafka.group_commit import GroupCommitter
from driftstream.engine.connectors.kafka.io import partition_count
from driftstream.engine.connectors.kafka.offset_gaps import OffsetGaps
from driftstream.engine.connectors.kafka.partition_log import PartitionLog, Step
from driftstream.engine.connectors.kafka.reach import bootstrap_errors, reach
from driftstream.engine.connectors.kafka.schema_registry import FORMATS as REGISTRY_FORMATS
from driftstream.engine.connectors.kafka.schema_registry import RegistryDecoder, RegistryUnavailable, SchemaRegistry, check_format, registry_of
from driftstream.engine.connectors.kafka.security import KafkaSecurity, security_of
from driftstream.engine.connectors.kafka.ticks import TICK_HEADER, TICK_MARK, PartitionTicker, is_tick
from driftstream.engine.connectors.kafka.topic_watch import LogWatch, TopicVanished, TopicWatch
from driftstream.engine.connectors.kafka.transactions import ISOLATION_LEVELS
from driftstream.engine.connectors.kafka.wire import CHECK_TIMEOUT_S, TopicFetcher, check_broker
from driftstream.engine.connectors.bad_record import bad_record
from driftstream.engine.connectors.partition_clock import PartitionClock
from driftstream.engine.model.connectors import Source, SourcePartition

#: Batches of records a partition's fetcher thread may hold ahead of the event loop.
PREFETCH_BATCHES = 4

#: How long the broker may hold a fetch of an idle partition: a record that arrives
#: meanwhile may wait that long (Tansu does not answer early), an idle reader
#: fetches 1000 / FETCH_WAIT_MS times a second.
FETCH_WAIT_MS = 5

#: Records not read yet from which ``status()`` says why a partition is behind (a few are
#: always in flight, and Tansu's high watermark can run one batch ahead).
BEHIND_LAG = 1_000

#: Seconds a hole in a partition's offsets may stay before the reader moves past it.
GAP_WAIT_S = 0.5

#: Seconds between metadata checks that an idle partition's topic still exists (one short
#: connection each; see :mod:`.topic_watch`).
TOPIC_CHECK_S = 5.0

#: Seconds fetches may report the partition's end below the reader's offset before the
#: metadata and the log are asked whether the topic was deleted or recreated (a broker may
#: report a short end for a moment: Tansu's can fall short by its last batch).
END_BELOW_S = 1.0

#: Seconds a record's timestamp may run ahead of its partition's time before the next record
#: must confirm it (else it is an outlier, stamped with the partition's time): a day.
MAX_TIME_JUMP_S = 86_400.0

__all__ = ["KafkaSource", "KafkaPartitionReader", "OffsetGaps", "TICK_HEADER", "TICK_MARK", "is_tick", "TopicVanished"]


def _json(value: bytes) -> Any:
    return json.loads(value)


class NullValue(ValueError):
    """A record with a null value (a tombstone): its dead letter's error."""


class _Decoded:
    """A record whose value was decoded in the fetcher thread (a registry format, whose
    look-ups must not block the event loop): the record's fields, then ``decoded`` or the
    ``error`` that makes it a dead letter."""

    __slots__ = ("offset", "timestamp", "key", "value", "headers", "decoded", "error")

    def __init__(self, rec: Any, decoded: Any, error: Optional[Exception]) -> None:
        self.offset, self.timestamp, self.key, self.value, self.headers = rec.offset, rec.timestamp, rec.key, rec.value, rec.headers
        self.decoded, self.error = decoded, error


def decoded_off_loop(step: Step, decode: RegistryDecoder, stop: threading.Event) -> Step:
    """``step`` with its records' values decoded (:class:`_Decoded`), in the fetcher thread:
    a registry format's schema look-ups may wait for the registry (retried up to its
    ``timeout_s``, ended by ``stop``), which in the event loop would stall heartbeats.
    RegistryUnavailable is raised (the run fails), a record's own error kept for its dead letter."""
    out = []
    for rec in step.records:
        if rec.value is None or is_tick(rec):
            out.append(rec)
            continue
        try:
            out.append(_Decoded(rec, decode(rec.value, stop), None))
        except RegistryUnavailable:
            raise  # the registry's fault, not the record's
        except Exception as exc:  # noqa: BLE001 - the record's: a dead letter
            out.append(_Decoded(rec, None, exc))
    return Step(out, step.through)


class KafkaSource(Source):
    """Read ``topic`` from ``bootstrap_servers``.

    ``value_format``: ``"json"`` (default), ``"bytes"``, or a callable ``bytes -> value``
    (raise to reject a record: it goes to the dead-letter sink).
    ``bounded=True`` reads what the topic holds when each partition is opened, then ends
    (read_committed: up to the last stable offset then).
    ``isolation``: ``"read_committed"`` (default: the records of committed transactions and
    non-transactional ones; aborted ones never) or ``"read_uncommitted"`` (every record).
    ``start_offsets``: ``{partition: (offset, running_ts)}`` to replay from (recovery).
    ``tick_interval``: seconds a partition may stay idle before the source appends a tick
    record to it (unbounded sources; None: never). The watermark is the minimum over all
    partitions, so one idle partition would hold back every other one's output; the tick
    moves its time forward through the log, so a replay sees the same times.
    ``gap_wait_s``: how long a hole in the offsets may stay before the reader skips it
    (see the module docstring). Apache Kafka only leaves holes that stay (compaction):
    a compacted topic may set 0 to skip them at once. Transaction markers are no holes.
    ``broker_timeout_s``: how long fetches from an unreachable broker (or a partition with
    no leader) are retried before the run fails with the error.
    ``max_time_jump_s``: how far (seconds) a record's timestamp may run ahead of its
    partition's time before the next record must confirm it; one the next record does not
    confirm (a producer's clock far off) is stamped with the partition's time and counted
    (``clamped_times`` in ``status()``), so it cannot move every window's time for good.
    A day by default; None: the plain running maximum (:mod:`.partition_clock`).
    ``security`` (or kafka-python's security settings as keyword arguments): TLS and SASL,
    see :class:`.KafkaSecurity`.
    ``commit_group``: a consumer group to which each committed snapshot's offsets are
    committed, for lag monitors (:mod:`.group_commit`); the flow never reads them back.
    """

    #: record timestamps: producers' wall clocks (CreateTime) or the broker's (LogAppendTime)
    epoch_ms_times = True
    emits_dead_letters = True
    #: 2 ms of record time (aligned by default, see engine/model/config.py)
    alignment_slack = 2.0

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        value_format: Union[str, Callable[[bytes], Any]] = "json",
        dlq_topic: Optional[str] = None,
        bounded: bool = False,
        start_offsets: Optional[dict] = None,
        tick_interval: Optional[float] = 0.02,
        gap_wait_s: float = GAP_WAIT_S,
        broker_timeout_s: float = 30.0,
        max_time_jump_s: Optional[float] = MAX_TIME_JUMP_S,
        security: Optional[KafkaSecurity] = None,
        commit_group: Optional[str] = None,
        isolation: str = "read_committed",
        schema_registry: Union[str, SchemaRegistry, None] = None,
        protobuf_message: Optional[type] = None,
        **security_settings: Any,
    ) -> None:
        if isolation not in ISOLATION_LEVELS:
            raise FlowError(f"KafkaSource({topic!r}) isolation must be one of {', '.join(map(repr, ISOLATION_LEVELS))}, not {isolation!r}")
        self.isolation = isolation
        self.security = security_of(security, security_settings)
        self.commit_group = commit_group
        if value_format == "json":
            self.decode: Optional[Callable[[bytes], Any]] = _json
        elif value_format == "bytes":
            self.decode = None
        elif callable(value_format):
            self.decode = value_format
        elif value_format in REGISTRY_FORMATS:
            check_format(value_format, f"KafkaSource({topic!r})", None, protobuf_message, writing=False)
            self.decode = RegistryDecoder(value_format, registry_of(schema_registry, f"KafkaSource({topic!r})"), topic, protobuf_message)
        else:
            raise FlowError(f"KafkaSource value_format must be 'json', 'bytes', 'avro', 'json-schema', 'protobuf' or a callable, "
                            f"not {value_format!r}")
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.dlq_topic = dlq_topic or f"{topic}.dlq"
        self.bounded = bounded
        self.tick_interval = None if bounded else tick_interval
        self.start_offsets = dict(start_offsets or {})
        self.gap_wait_s = gap_wait_s
        self.broker_timeout_s = broker_timeout_s
        if max_time_jump_s is not None and not max_time_jump_s > 0:
            raise FlowError(f"KafkaSource({topic!r}) max_time_jump_s must be a positive number of seconds or None, not {max_time_jump_s!r}")
        self.max_time_jump_s = max_time_jump_s
        self._partitions: Optional[int] = None

    def partitions(self) -> int:
        """The topic's partition count, asked once. A broker that cannot be reached fails it
        within ``broker_timeout_s`` with :class:`.BrokerUnreachable` (naming this step, the
        topic, the address and what to check), not kafka-python's bare bootstrap timeout."""
        if self._partitions is None:
            who = f"KafkaSource {self.step_name!r} (topic {self.topic!r})"
            reach(self.bootstrap_servers, who, self.broker_timeout_s)
            check_broker(self.bootstrap_servers, self.security, min(CHECK_TIMEOUT_S, self.broker_timeout_s))
            with bootstrap_errors(self.bootstrap_servers, who, self.broker_timeout_s):
                n = partition_count(self.bootstrap_servers, self.topic, security=self.security, bootstrap_timeout_s=self.broker_timeout_s)
            if n == 0:
                raise FlowError(f"Kafka topic {self.topic!r} does not exist at {self.bootstrap_servers}: create it first")
            self._partitions = n
        return self._partitions

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return KafkaPartitionReader(self, partition, source_id, start)

    def commit_hook(self) -> Optional[GroupCommitter]:
        if self.commit_group is None:
            return None
        return GroupCommitter(self.bootstrap_servers, self.topic, self.commit_group, self.security)

    def __repr__(self) -> str:
        return f"KafkaSource({self.topic!r}, {self.bootstrap_servers!r}, security={self.security!r})"


class KafkaPartitionReader(SourcePartition):
    """One topic partition: decodes records, stamps times, diverts bad records."""

    def __init__(self, source: KafkaSource, partition: int, source_id: int, start: Optional[tuple] = None) -> None:
        self.source = source
        self.partition = partition
        self.source_id = source_id
        self.tp = TopicPartition(source.topic, partition)
        offset, ts = start if start is not None else source.start_offsets.get(partition, (0, None))
        self.next_offset = offset
        # The partition's time: the running max of its timestamps, bounded (see PartitionClock).
        self.clock = PartitionClock(ts, None if source.max_time_jump_s is None else int(source.max_time_jump_s * 1000))
        self._last_activity = time.time()
        self._buffer: list = []
        self._buffer_through = offset  # where the reader is once the buffer is read
        # Polled from the event loop, every fetch would hold it up for the broker's
        # answer: a fetcher thread long-polls instead (on a socket of its own,
        # :class:`.TopicFetcher`), and the event loop only takes what it has fetched.
        # The same thread appends the ticks the event loop asks for, between fetches.
        self._fetcher_client = self._new_fetcher("driftstream-fetch")
        self.log = self._new_log(self._fetcher_client, offset)
        # At open, from batch headers only: a codec or a broker error is the first read's,
        # not the actor's creation's (which a recovery would only repeat).
        self.end = self.log.end_offset(source.broker_timeout_s) if source.bounded else None
        self.done = self.end is not None and offset >= self.end
        self._tick_wanted = False
        # The last fetch found nothing past the reader's offset: the partition is idle, not
        # merely slow to answer (only then may a tick be appended: a tick is a batch, and
        # on Tansu every batch in the log makes each fetch slower).
        self._caught_up = False
        self._fetched: deque = deque()
        self._closing = threading.Event()
        self._fetch_error: Optional[BaseException] = None
        # Whether the topic is still there: a deleted one need not say so in fetch answers (.topic_watch).
        topic = TopicWatch(source.bootstrap_servers, source.topic, partition, f"KafkaSource {source.step_name!r}", source.security,
                           TOPIC_CHECK_S)
        self._watch = LogWatch(topic, END_BELOW_S)
        self._ticker = PartitionTicker(source, partition, topic)
        self._fetcher = threading.Thread(target=self._fetch, name=f"kafka-fetch-{self.tp.topic}-{partition}", daemon=True)
        self._fetcher_started = False  # started by the first read(), after any skip_after()
        # A registry format decodes in the fetcher thread: a schema look-up may wait for the
        # registry (retried up to its timeout_s), which in the event loop would stall heartbeats.
        self._registry = source.decode if isinstance(source.decode, RegistryDecoder) else None
        self._jump: Optional[tuple] = None  # (first offset not to replay, live end): at-most-once
        self.skipped = 0

    def _new_fetcher(self, client_id: str) -> TopicFetcher:
        src = self.source
        return TopicFetcher(src.bootstrap_servers, src.topic, [self.partition], max_wait_ms=FETCH_WAIT_MS, client_id=client_id,
                            timeout_s=src.broker_timeout_s, security=src.security)

    def _new_log(self, fetcher: TopicFetcher, offset: int) -> PartitionLog:
        return PartitionLog(fetcher, self.partition, offset, self.source.isolation == "read_committed", self.source.gap_wait_s)

    @property
    def gaps(self) -> OffsetGaps:
        """The holes waited for and skipped (:class:`.OffsetGaps`)."""
        return self.log.gaps

    @property
    def ts(self) -> Optional[int]:
        """The partition's time: the last record's stamp (None before the first)."""
        return self.clock.ts

    @property
    def ticks_sent(self) -> int:
        """Ticks this reader appended."""
        return self._ticker.sent

    def position(self) -> tuple:
        """``(next offset, running ts)``: where a replay of what follows must start (at a
        record the clock holds, if it holds one)."""
        return self.next_offset, self.clock.ts

    def lag(self) -> Optional[int]:
        """High watermark of the last fetch - next offset to read (0 when caught up).
        Tansu reports the high watermark as the last batch's base offset + 1, so there it
        can fall short by the size of the last batch."""
        high = self._fetcher_client.high_watermarks.get(self.partition)
        return None if high is None else max(0, high - self.next_offset)

    def fetch_state(self) -> dict:
        """How the broker answers this partition's fetches, for ``status()``: the records
        not read yet (``lag``), the last answer's time (``fetch_ms``), the wait asked for
        (``max_wait_ms``), and the answers that came back empty although the partition held
        more (``starved``). ``behind`` says why the source is behind when the broker is
        what limits it, else None."""
        wait = self._fetcher_client.wait
        lag = self.lag()
        behind = None
        if lag is not None and lag >= BEHIND_LAG and wait.took_ms > wait.floor_ms:
            behind = (
                f"the broker takes {wait.took_ms:.0f} ms to answer a fetch of {self.source.topic}[{self.partition}] "
                f"(a broker that scans the partition's log per fetch, as Tansu's in-memory store does, slows as the log grows)"
            )
        return {
            "partition": f"{self.source.topic}[{self.partition}]",
            "lag": lag,
            "fetch_ms": round(wait.took_ms, 1),
            "max_wait_ms": wait.wait_ms,
            "starved": wait.starved,
            "ticks": self.ticks_sent,
            "clamped_times": self.clock.clamped,
            "behind": behind,
        }

    def skip_after(self, t: tuple) -> int:
        """Replay the records whose time is at or below ``t``, then jump to the live end.

        Finds the first record after ``t`` by reading from the replay position on a
        connection of its own (the records since the snapshot: at most an interval's worth,
        read for up to 10 s), as the reader would read them.
        """
        if self._fetcher_started or self.done:
            raise RuntimeError("skip_after must come before the first read")
        fetcher = self._new_fetcher("driftstream-skip")
        try:
            log_ = self._new_log(fetcher, self.next_offset)
            live_end = log_.end_offset(self.source.broker_timeout_s)
            first_after, deadline = live_end, time.monotonic() + 10.0
            clock, after = PartitionClock(self.clock.ts, self.clock.max_jump_ms), tuple(t[:4])
            while first_after == live_end and log_.next_offset < live_end and time.monotonic() < deadline:
                step = log_.read()
                for rec in step.records if step is not None else ():
                    after_t = [r.offset for r, ts in clock.offer(rec.timestamp, rec) if (ts, self.source_id, self.partition, r.offset) > after]
                    if after_t:
                        first_after = after_t[0]
                        break
            if first_after == live_end and clock.holding:
                first_after = clock.held.offset  # its stamp is at least the clock's: after t, or nearly so
        finally:
            fetcher.close()
        if first_after < live_end:
            self._jump = (first_after, live_end)
        return max(0, live_end - first_after)

    def _fetch(self) -> None:
        # Only this thread reads the log (and moves its offset).
        log_, closing, fetched = self.log, self._closing, self._fetched
        try:
            while not closing.is_set():
                if self._tick_wanted:
                    self._tick_wanted = False
                    self._tick()
                if len(fetched) >= PREFETCH_BATCHES:
                    time.sleep(0.002)  # the event loop has not caught up: fetch no further ahead
                    continue
                if log_.caught_up and (fetched or self._buffer):
                    # At the log's end with records still to hand out: nothing new is needed
                    # yet. Long polls every FETCH_WAIT_MS (~150 a second) cost the source and
                    # the broker CPU for the rest of a backlog once its tail was prefetched.
                    time.sleep(0.001)
                    continue
                jump = self._jump
                if jump is not None and log_.next_offset >= jump[0]:
                    self._jump = None
                    log_.moved_to(jump[1])
                    fetched.append(jump)
                    continue
                step = log_.read()
                if step is None:
                    self._caught_up = log_.caught_up
                    self._watch.idle(log_, self._caught_up)
                    continue
                self._caught_up = False
                self._watch.reading()
                if self._fetcher_client.wait.pause_s:
                    closing.wait(self._fetcher_client.wait.pause_s)  # a slow broker: leave it time for others
                if jump is not None and step.through > jump[0]:
                    # Keep what precedes the jump; skip the rest (at-most-once).
                    self._jump = None
                    log_.moved_to(jump[1])
                    fetched.append(self._decoded(Step([r for r in step.records if r.offset < jump[0]], jump[0])))
                    fetched.append(jump)
                    continue
                fetched.append(self._decoded(step))
                if self.end is not None and step.through >= self.end:
                    return
        except BaseException as exc:  # handed to the event loop by read()
            if not closing.is_set():
                self._fetch_error = self._watch.refine(exc)

    def _decoded(self, step: Step) -> Step:
        return step if self._registry is None else decoded_off_loop(step, self._registry, self._closing)

    def read(self, max_items: int) -> list:
        """Up to ``max_items`` elements (one more when a record the clock held is released
        with the first of them)."""
        if not self._fetcher_started and not self.done:
            self._fetcher_started = True
            self._fetcher.start()
        while not self._buffer and self._fetched:
            got = self._fetched.popleft()
            if isinstance(got, tuple):  # the at-most-once jump: (first skipped offset, live end)
                self.skipped += got[1] - got[0]
                self.next_offset = got[1]
            else:  # a Step: its records, then the markers and dropped records up to got.through
                self._buffer, self._buffer_through = got.records, got.through
                if not got.records and not self.clock.holding:
                    self.next_offset = max(self.next_offset, got.through)
        if not self._buffer:
            if self.end is not None and self.clock.holding and self._buffer_through >= self.end and not self._fetched:
                out = self._take(self.clock.finish(), [])  # the partition's last record: nothing follows to judge it
                self.next_offset = max(self.next_offset, self._buffer_through)
                self.done = True
                return out
            if self.end is not None and self.next_offset >= self.end:
                self.done = True  # the partition ends with a marker or with dropped records
                return []
            if self._fetch_error is not None:
                raise self._fetch_error
            self._maybe_tick()
            return []
        self._last_activity = time.time()
        records, self._buffer = self._buffer[:max_items], self._buffer[max_items:]
        out: list = []
        clock = self.clock
        for rec in records:
            if self.end is not None and rec.offset >= self.end:
                self.done = True
                break
            self._take(clock.offer(rec.timestamp, rec), out)
            self.next_offset = clock.held.offset if clock.holding else rec.offset + 1
        if not self._buffer and not clock.holding:
            self.next_offset = max(self.next_offset, self._buffer_through)
        if self.end is not None and self.next_offset >= self.end:
            self.done = True
        return out

    def _take(self, stamped: list, out: list) -> list:
        """Append the elements of ``(record, stamp)`` pairs to ``out``: ticks only move time,
        records that do not decode become dead letters."""
        decode, sid, p = self.source.decode, self.source_id, self.partition
        for rec, ts in stamped:
            if rec.headers and is_tick(rec):
                continue
            meta = (ts, sid, p, rec.offset, (), False)
            if rec.value is None:
                out.append((meta, self._dead_letter(meta, rec, NullValue("a null value (a tombstone): a flow's elements are record values"))))
                continue
            if decode is None:
                value = rec.value
            elif type(rec) is _Decoded:  # decoded in the fetcher thread
                if rec.error is not None:
                    out.append((meta, self._dead_letter(meta, rec, rec.error)))
                    continue
                value = rec.decoded
            else:
                try:
                    value = decode(rec.value)
                except RegistryUnavailable:
                    raise  # the registry's fault, not the record's
                except Exception as exc:
                    out.append((meta, self._dead_letter(meta, rec, exc)))
                    continue
            out.append((meta, value))
        return out

    def bound(self) -> Optional[tuple]:
        # Everything up to next_offset - 1 was read (emitted, skipped or dead-lettered):
        # later records have ts >= self.ts and a larger offset.
        if self.ts is None:
            return None
        return (self.ts, self.source_id, self.partition, self.next_offset - 1)

    def _maybe_tick(self) -> None:
        interval = self.source.tick_interval
        if interval is None or not self._caught_up or time.time() - self._last_activity < interval:
            return
        self._tick_wanted = True  # the fetcher thread appends it between two fetches
        self._last_activity = time.time()

    def _tick(self) -> None:
        # Durable: the tick is read back like any record, so its timestamp is part of the log.
        self._ticker.tick()

    def _dead_letter(self, meta: tuple, rec: Any, exc: Exception) -> DeadLetter:
        """The element a record that does not decode becomes: a dead letter at its own t,
        which the flow's dead-letter sink writes through its barrier (exactly once)."""
        record = bad_record(self.source.topic, self.partition, rec.offset, rec.timestamp, rec.key, rec.value)
        return dead_letter(self.source.step_name, meta, record, exc)

    def close(self) -> None:
        self._closing.set()
        if self._fetcher_started:
            self._fetcher.join(timeout=5)
        self._fetcher_client.close()
        self._ticker.close()

    def __repr__(self) -> str:
        return f"KafkaPartitionReader({self.source.topic}[{self.partition}] at {self.next_offset}, ts={short_repr(self.ts)})"
