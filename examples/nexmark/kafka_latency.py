"""Nexmark latency of driftstream end to end, measured the way Flink's is
(:func:`.flink_queries.run_flink_latency`), from the same bytes.

The events go into a two-partition Kafka topic (event ``i`` in partition ``i % 2``, the
record's timestamp its event time in ms, its value the JSON line Flink's files hold) in
the chunks Flink's files hold (:func:`.flink_queries.feed_chunks`, 0.1 s of events each),
each when its due time comes, after warm-up records went through. The query reads them
with a :class:`~driftstream.engine.KafkaSource` and writes a
:class:`~driftstream.engine.connectors.file_sink.FileSink`, exactly-once with 1 s snapshots; a
poller reads the sink's files every 10 ms. A result's latency = seen in a file - the
broker's acknowledgement of the chunk holding its releasing event (the event itself for
q1-q3; for a window, the first event at or past its end: our watermark has no delay).
Flink's: seen in a committed part file - the file of that chunk renamed in. The results
are checked as multisets against the direct computation, as Flink's.

What differs, and is said in the table: our input is a broker (Flink has no Kafka jar
here), Flink's a directory it lists every 50 ms. A window's results need both partitions
past its end; when the other partition's next event falls in the next chunk, the clock
starts a chunk early (against us, by up to 0.1 s).

The source appends no ticks (``tick_interval=None``): record timestamps are event times
from 0, a tick's the wall clock; both partitions get records in every chunk, and two
flush records an hour of event time ahead close the last windows.

    row = run_kafka_latency("q7", events(60_000, rate=2000), Path("/tmp/q7"), rate=2000, bootstrap_servers="127.0.0.1:9092")
"""

from __future__ import annotations

import glob
import math
import os
import time
from pathlib import Path
from typing import Optional, Sequence

import orjson

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.examples.flink_job import Scheduled

from .direct import direct_results
from .flink_queries import LATENCY_DEFAULTS, PARALLELISM, WARMUP, _dumps, _ms, check_results, feed_chunks, flush_record, result_latencies
from .queries import build

#: How often the output files are read for new rows (Flink's part files: as often).
POLL_S = 0.01


class KafkaFeeder(Scheduled):
    """Produces ``chunks`` ``(events, due)`` into ``topic`` at their due times; ``arrived[k]``:
    when the broker had acknowledged chunk ``k``, ``flushed``: the flush records (one per
    partition) after the last."""

    def __init__(self, bootstrap_servers: str, topic: str, chunks: Sequence[tuple], flush: dict, partitions: int = PARALLELISM) -> None:
        from kafka import KafkaProducer

        super().__init__(chunks, "nexmark-kafka-feeder")
        self.topic, self.flush, self.partitions = topic, flush, partitions
        self.producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=0, acks=1)
        self.arrived = self.handed
        self.flushed: Optional[float] = None
        self._first = 0  # the index of the next chunk's first event

    def send(self, events: Sequence[dict], first: int = 0) -> None:
        """Events ``first, first + 1, ...`` to their partitions, acknowledged when this returns."""
        for i, e in enumerate(events, first):
            self.producer.send(self.topic, _dumps(e).encode(), partition=i % self.partitions, timestamp_ms=math.floor(e["time"] * 1000))
        self.producer.flush()

    def deliver(self, i: int, item: tuple) -> None:
        self.send(item[0], self._first)
        self._first += len(item[0])

    def finish(self) -> None:
        self.send([self.flush] * self.partitions)
        self.flushed = time.time()

    def stop(self) -> None:
        super().stop()
        self.producer.close()


class SinkTail:
    """The rows a FileSink's partition files gain, as they gain them (complete lines only)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.pattern = str(Path(directory) / f"{glob.escape(name)}-*.jsonl")
        self.read_to: dict[str, int] = {}
        self.rows: list = []
        self.visible: list[float] = []

    def poll(self) -> int:
        """Read what was appended since the last poll; returns the rows found."""
        now, found = time.time(), 0
        for path in glob.glob(self.pattern):
            start = self.read_to.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            if end:
                rows = [orjson.loads(line)["value"] for line in data[:end].splitlines()]
                self.read_to[path] = start + end
                self.rows += rows
                self.visible += [now] * len(rows)
                found += len(rows)
        return found


def run_kafka_latency(query: str, evs: list, workdir: Path, *, rate: float, bootstrap_servers: str, expected: Optional[list] = None,
                      parallelism: int = PARALLELISM, warmup_timeout: float = 120.0) -> dict:
    """``query`` on Ray reading ``evs`` from Kafka as they are fed at ``rate`` events/s; its
    row: end-to-end p50/p99 (``p50_ms``, ``p99_ms``), the engine's own (source emit -> sink
    acknowledged, ``engine_p50_ms``, ``engine_p99_ms``), results checked."""
    from driftstream.engine import KafkaSource
    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.model.result import percentiles

    workdir = Path(workdir)
    expected = expected if expected is not None else direct_results(query, evs)
    topic = f"nexmark-{query}-{time.time_ns()}"
    ensure_topic(bootstrap_servers, topic, parallelism)
    out_dir = workdir / f"{topic}-out"
    source = KafkaSource(topic, bootstrap_servers, value_format=orjson.loads, tick_interval=None, dlq_topic=f"{topic}.dlq")
    flow = build(query, source, FileSink(out_dir, name=query), name=topic)
    interval = LATENCY_DEFAULTS["file_interval"]
    chunks = feed_chunks(evs, rate, interval)
    feeder = KafkaFeeder(bootstrap_servers, topic, chunks, flush_record(evs), parallelism)
    tail, problems, ready = SinkTail(out_dir, query), [], None
    launched = time.time()
    try:
        handle = flow.start(parallelism=parallelism, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(workdir / f"{topic}-snaps"))
    except BaseException:
        feeder.stop()
        raise
    try:
        # Two per partition: a partition's first record waits for the next to confirm its
        # timestamp (:mod:`driftstream.engine.connectors.partition_clock`).
        warmups = [WARMUP] * (2 * parallelism)
        feeder.send(warmups)
        deadline = time.time() + warmup_timeout
        while _read(handle) < len(warmups) and time.time() < deadline:
            time.sleep(0.05)
        if _read(handle) < len(warmups):
            problems.append(f"the warm-up records were not read within {warmup_timeout:.0f} s")
        else:
            ready = time.time() - launched
            feeder.start()
            deadline = time.time() + len(evs) / rate + 60
            while len(tail.rows) < len(expected) and time.time() < deadline:
                tail.poll()
                time.sleep(POLL_S)
    finally:
        feeder.stop()
        result = handle.stop()
    got = [v for _, v in read_file_sink(out_dir, query)]
    problems += check_results(got, expected)
    if len(tail.rows) < len(got):
        problems.append(f"{len(got) - len(tail.rows)} row(s) came after the watch ended")
    if result.metrics.dead_letters:
        problems.append(f"{result.metrics.dead_letters} dead letter(s)")
    p = percentiles(result_latencies(query, expected, evs, tail.rows, tail.visible, feeder.arrived, len(chunks[0][0]) if chunks else 1, feeder.flushed))
    engine = result.metrics.latency_ms
    fed = [t for t in feeder.arrived if t is not None]
    return {
        "engine": "driftstream", "query": query, "events": len(evs), "mode": f"{rate:g} events/s via kafka",
        "seconds": round((tail.visible[-1] if tail.visible else time.time()) - fed[0], 2) if fed else 0.0,
        "events_per_s": round(len(evs) / (fed[-1] - fed[0]), 1) if len(fed) > 1 and fed[-1] > fed[0] else None,
        "results": len(got), "p50_ms": _ms(p.get("p50")), "p99_ms": _ms(p.get("p99")), "max_ms": _ms(p.get("max")),
        "engine_p50_ms": _ms(engine.get("p50")), "engine_p99_ms": _ms(engine.get("p99")), "ready_after_s": None if ready is None else round(ready, 1),
        "snapshots": result.metrics.snapshots, "correct": not problems, "problems": problems[:10],
    }  # fmt: skip


def _read(handle) -> int:
    """Elements the flow's sources have read so far (0 while it starts)."""
    try:
        return int(handle.status().get("emitted") or 0)
    except Exception:  # the coordinator not answering yet
        return 0
