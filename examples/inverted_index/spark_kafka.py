"""A Kafka source and an exactly-once Kafka sink for Spark Structured Streaming, as Python data sources.

The Spark Kafka connector jar is not available here, so both ends are Spark 4
*Python data sources* (``pyspark.sql.datasource``) over kafka-python. Register
the source once per session, then use the format name ``driftstream_kafka``::

    spark.dataSource.register(KafkaDataSource)
    df = (spark.readStream.format("driftstream_kafka")
          .option("bootstrap.servers", "127.0.0.1:9092").option("topic", "docs").load())
    # df: partition int, offset long, timestamp long, value string
    (df.select("value").writeStream.format("driftstream_kafka")
       .option("bootstrap.servers", "127.0.0.1:9092").option("topic", "out")
       .option("checkpointLocation", "/tmp/ck").start())

Source
------
Offsets are Kafka offsets: ``{"<partition>": <next offset>}``, so Spark's
offset log replays exactly the records of an unfinished micro-batch after a
restart. Options: ``bootstrap.servers``, ``topic``, ``startingOffsets``
(``earliest``, the default, or ``latest``), ``maxWaitSeconds`` (how long a read
task waits for records it was promised; default 60).

``latestOffset`` runs on every trigger, so it is cheap: the reader keeps one
consumer (per reader instance, in Spark's long-lived source-runner process)
assigned to every partition, asks for the reported end offsets (one request)
and only when they moved reads the new tail. Tansu, the local broker, reports
the base offset of the last record batch + 1 instead of the true end; Kafka
fetches return whole record batches, so reading until the consumer's position
reaches the reported end receives the whole last batch and the position is then
the true end (on Apache Kafka the reported end is already the true end). This is
the incremental form of :func:`driftstream.engine.connectors.kafka.io.true_end`, without
its 300 ms idle wait per call.

Read tasks (on executors) keep one consumer per Python worker process (Spark
reuses its Python workers) and read ``[start, end)`` of their partition.

Sink
----
Rows must have a ``value`` string column (the message value, UTF-8); optional
columns: ``key`` (string; message key, and the partition is chosen from it the
way Kafka's default partitioner does) and the columns named by the
``orderBy`` option (comma-separated): the micro-batch's rows are written sorted
by them, so the output order is deterministic.

Exactly-once the Spark way (idempotent by batch id, like ``foreachBatch``):
``write`` (executors) only collects its rows into the commit message; ``commit``
(driver, once all tasks succeeded, before Spark records the batch in its commit
log) writes the batch, each message with the header ``driftstream-spark-batch``
= ``"<batch id>,<seq>"`` (``seq``: index of the message among this batch's
messages in its partition), and flushes the producer before returning. After a
restart Spark replays the last batch whose commit it did not record; the sink
reads the last message of every output partition once per process and skips
what is already there: batches with a smaller id entirely, and the first
``seq + 1`` messages of the partition for the same batch id (a batch whose
write was cut off half way is completed, not duplicated). Spark recomputes the
replayed batch from the same offsets and the same state version, and ``orderBy``
makes its message order deterministic, so the skip is exact.

Why write in ``commit`` and not in the executors' ``write``: ``write`` does not
know the batch id, and a single ordered writer is what makes "the last
message" a complete description of what was written. The batch's rows travel
to the driver in the commit messages (fine for this workload's volumes).

The per-process state (producer, last ``(batch, seq)`` per partition) lives in
Spark's reused sink-runner Python process; it assumes one query writes the
topic and that a restart is a new Spark application (as with the baseline's
CLI). The output topic is created with one partition if it does not exist.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, last_record
from kafka.partitioner.default import murmur2
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

FORMAT = "driftstream_kafka"
SCHEMA = "partition int, offset long, timestamp long, value string"
BATCH_HEADER = "driftstream-spark-batch"

# Kafka fetches return whole record batches; a large ``max_poll_records`` hands a
# whole fetched batch to one poll, so the position lands on a batch boundary.
_CONSUMER_KW = dict(max_poll_records=100_000, fetch_max_wait_ms=20)


def _topic_partitions(c, topic: str, timeout: float = 10.0) -> list[int]:
    deadline = time.time() + timeout
    while True:
        parts = c.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.time() > deadline:
            raise RuntimeError(f"Kafka topic {topic!r} does not exist (or has no partitions)")
        time.sleep(0.05)


def read_to(c, tp, target: int, timeout: float) -> list:
    """Poll ``tp`` (already positioned) until the consumer's position reaches ``target``; the records read."""
    out: list = []
    deadline = time.time() + timeout
    while c.position(tp) < target:
        if time.time() > deadline:
            raise TimeoutError(f"{tp}: position {c.position(tp)} did not reach offset {target} within {timeout}s")
        out.extend(c.poll(timeout_ms=100).get(tp, ()))
    return out


class KafkaDataSource(DataSource):
    """``driftstream_kafka``: a Kafka stream reader and an exactly-once stream writer (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> "KafkaStreamReader":
        return KafkaStreamReader(dict(self.options))

    def streamWriter(self, schema, overwrite: bool) -> "KafkaStreamWriter":
        return KafkaStreamWriter(dict(self.options), [f.name for f in schema.fields])


def _option(options: dict, name: str, default: Optional[str] = None) -> str:
    # Spark may hand options over case-insensitively (lower-cased keys).
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    if default is None:
        raise ValueError(f"the {FORMAT} data source needs the option {name!r}")
    return default


@dataclass
class KafkaRange(InputPartition):
    """Records ``[start, end)`` of one Kafka partition."""

    partition: int
    start: int
    end: int


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict) -> None:
        self.bootstrap = _option(options, "bootstrap.servers")
        self.topic = _option(options, "topic")
        self.starting = _option(options, "startingOffsets", "earliest").lower()
        self.max_wait = float(_option(options, "maxWaitSeconds", "60"))
        if self.starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest' or 'latest', not {self.starting!r}")
        self._c = None  # driver-side consumer, created on first use (the reader is pickled for read tasks)
        self._tps: dict = {}
        self._known: dict[int, int] = {}  # partition -> an offset known to be at or before the true end

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_c=None, _tps={}, _known={})
        return state

    # -- driver side --------------------------------------------------------------
    def _consumer(self):
        if self._c is None:
            from kafka import TopicPartition

            self._c = consumer(self.bootstrap, **_CONSUMER_KW)
            parts = _topic_partitions(self._c, self.topic)
            self._tps = {p: TopicPartition(self.topic, p) for p in parts}
            self._c.assign(list(self._tps.values()))
        return self._c

    def initialOffset(self) -> dict:
        c = self._consumer()
        if self.starting == "earliest":
            begin = c.beginning_offsets(list(self._tps.values()))
            return {str(p): begin[tp] for p, tp in self._tps.items()}
        return self._ends({})

    def _ends(self, start: dict) -> dict:
        """The true end offset of every partition (cheap when nothing new arrived)."""
        c = self._consumer()
        reported = c.end_offsets(list(self._tps.values()))
        out = {}
        for p, tp in self._tps.items():
            known = self._known.get(p)
            floor = int(start.get(str(p), 0))
            if known is None or known < floor:
                known = floor
            target = reported[tp]  # on Tansu: base offset of the last batch + 1
            if target > known:
                # Everything before ``target`` exists; reading through offset target-1
                # receives the whole last batch, so the position is then the true end.
                c.seek(tp, max(known, target - 1))
                read_to(c, tp, target, self.max_wait)
                known = max(known, c.position(tp))
            self._known[p] = known
            out[str(p)] = known
        return out

    def latestOffset(self, start: dict, limit) -> dict:
        return self._ends(start)

    def partitions(self, start: dict, end: dict) -> Sequence[KafkaRange]:
        ranges = []
        for p, e in end.items():
            s = int(start.get(p, 0))
            if int(e) > s:
                ranges.append(KafkaRange(int(p), s, int(e)))
        return ranges

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        if self._c is not None:
            self._c.close()
            self._c = None

    # -- executor side ------------------------------------------------------------
    def read(self, partition: KafkaRange) -> Iterator[tuple]:
        from kafka import TopicPartition

        c = _worker_consumer(self.bootstrap)
        tp = TopicPartition(self.topic, partition.partition)
        c.assign([tp])
        c.seek(tp, partition.start)
        deadline = time.time() + self.max_wait
        p, end = partition.partition, partition.end
        while c.position(tp) < end:
            if time.time() > deadline:
                raise TimeoutError(
                    f"{self.topic}[{p}]: records up to offset {end} were announced but only "
                    f"{c.position(tp)} could be read within {self.max_wait}s"
                )
            for r in c.poll(timeout_ms=100).get(tp, ()):
                if r.offset >= end:
                    break
                yield (p, r.offset, r.timestamp, None if r.value is None else r.value.decode("utf-8"))


_worker_consumers: dict = {}
_worker_lock = threading.Lock()


def _worker_consumer(bootstrap: str):
    """One consumer per Python worker process and cluster (Spark reuses its Python workers)."""
    with _worker_lock:
        c = _worker_consumers.get((os.getpid(), bootstrap))
        if c is None:
            c = consumer(bootstrap, **_CONSUMER_KW)
            _worker_consumers[(os.getpid(), bootstrap)] = c
        return c


# ---------------------------------------------------------------------------- sink


@dataclass
class KafkaRows(WriterCommitMessage):
    """One write task's rows: ``(order..., key, value)`` tuples."""

    rows: list = field(default_factory=list)


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict, columns: list[str]) -> None:
        self.bootstrap = _option(options, "bootstrap.servers")
        self.topic = _option(options, "topic")
        order = _option(options, "orderBy", "")
        self.order = [c.strip() for c in order.split(",") if c.strip()]
        if "value" not in columns:
            raise ValueError(f"the {FORMAT} sink needs a 'value' column; the stream has {columns}")
        missing = [c for c in self.order if c not in columns]
        if missing:
            raise ValueError(f"orderBy columns {missing} are not in the stream's columns {columns}")
        self.keyed = "key" in columns

    def write(self, iterator: Iterator) -> KafkaRows:
        """Executor side: the task's Arrow batches -> ``(order..., key, value)`` tuples for the commit."""
        rows: list = []
        for batch in iterator:
            cols = [batch.column(c).to_pylist() for c in self.order]
            cols.append(batch.column("key").to_pylist() if self.keyed else [None] * batch.num_rows)
            cols.append(batch.column("value").to_pylist())
            rows.extend(zip(*cols))
        return KafkaRows(rows)

    def commit(self, messages: list, batchId: int) -> None:
        rows = [r for m in messages if m is not None for r in m.rows]
        if self.order:
            rows.sort(key=lambda r: r[: len(self.order)])
        _sink_state(self.bootstrap, self.topic).write(batchId, [(r[-2], r[-1]) for r in rows])

    def abort(self, messages: list, batchId: int) -> None:
        pass  # nothing was written: commit writes


class _SinkState:
    """The producer of one output topic and, per partition, the last ``(batch, seq)`` written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaProducer, TopicPartition

        self.topic = topic
        n = ensure_topic(bootstrap, topic, 1)
        self.partitions = list(range(n))
        c = consumer(bootstrap)
        try:
            self.last: dict[int, tuple[int, int]] = {}
            for p in self.partitions:
                rec = last_record(c, TopicPartition(topic, p))
                stamp = None if rec is None else dict(rec.headers or ()).get(BATCH_HEADER)
                if stamp is not None:
                    b, s = stamp.decode().split(",")
                    self.last[p] = (int(b), int(s))
        finally:
            c.close()
        # One request in flight keeps every partition in the order we send.
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=0,
            batch_size=512 * 1024,
            max_in_flight_requests_per_connection=1,
        )

    def write(self, batch: int, rows: list) -> int:
        """Write ``(key, value)`` rows as batch ``batch``; returns how many were written (not skipped)."""
        seq = {p: 0 for p in self.partitions}
        written = 0
        send, topic, n = self.producer.send, self.topic, len(self.partitions)
        for key, value in rows:
            kb = None if key is None else key.encode("utf-8")
            p = 0 if kb is None or n == 1 else (murmur2(kb) & 0x7FFFFFFF) % n  # Kafka's default partitioner
            s = seq[p]
            seq[p] = s + 1
            last = self.last.get(p)
            if last is not None and (batch < last[0] or (batch == last[0] and s <= last[1])):
                continue  # already in the topic: a replay of a batch written (partly) before a restart
            send(topic, value=value.encode("utf-8"), key=kb, partition=p, headers=[(BATCH_HEADER, f"{batch},{s}".encode())])
            written += 1
        self.producer.flush()  # every message is in the broker before Spark records the commit
        for p, n in seq.items():
            if n:
                last = self.last.get(p)
                if last is None or batch > last[0] or (batch == last[0] and n - 1 > last[1]):
                    self.last[p] = (batch, n - 1)
        return written


_sinks: dict = {}
_sinks_lock = threading.Lock()


def _sink_state(bootstrap: str, topic: str) -> _SinkState:
    with _sinks_lock:
        key = (os.getpid(), bootstrap, topic)
        s = _sinks.get(key)
        if s is None:
            s = _sinks[key] = _SinkState(bootstrap, topic)
        return s
