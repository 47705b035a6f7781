"""How a broker's fetch answer grows with its log, and whether the log can be cut.

    driftstream bench broker-log                                   # a local Tansu
    driftstream bench broker-log --batches 40000 --bootstrap HOST:PORT

Writes one-record batches to a fresh one-partition topic, ``step`` at a time, and
after each step times a fetch at the partition's last record: what a reader that
keeps up pays per fetch (the soak's sources fetch like that, all the time). Then it
asks the broker to delete every record below the last one (DeleteRecords: what a
retention policy does to a log) and times the same fetch again; and it creates a
topic with ``retention.ms`` / ``retention.bytes`` far below what it writes, to see
whether the broker enforces them within ``retention_wait_s``.

On Tansu 0.6.0's in-memory store (the local broker) a fetch lists every batch of
the partition, so its answer grows ~0.6 us per stored batch; DeleteRecords is not
implemented there (the broker's handler panics and drops the connection), and
retention settings are stored but not enforced. A real Kafka finds the offset
through its index: the answer stays flat, and DeleteRecords moves the log start.

>>> fit_us_per_batch([LogPoint(1000, 1.0, 0.2), LogPoint(3000, 2.2, 0.2)])
0.6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

#: The record every batch carries: the soak's size.
VALUE = b'{"k":1,"c":"a"}'


@dataclass
class LogPoint:
    """After ``batches`` stored: the median fetch answer at the log's end, the mean write."""

    batches: int
    fetch_ms: float
    write_ms: float


@dataclass
class Truncation:
    """What DeleteRecords below ``requested`` did. ``supported``: the broker answered
    without error and moved its log start; ``fetch_ms``: the same end-of-log fetch after."""

    requested: int
    supported: bool
    error: Optional[str] = None
    log_start: Optional[int] = None
    fetch_ms: Optional[float] = None


@dataclass
class Retention:
    """A topic created with ``configs``: its log start ``waited_s`` after ``written`` batches."""

    configs: dict
    written: int
    waited_s: float
    log_start: Optional[int]

    @property
    def enforced(self) -> bool:
        return bool(self.log_start)


@dataclass
class BrokerLogReport:
    points: list = field(default_factory=list)
    truncation: Optional[Truncation] = None
    retention: Optional[Retention] = None


def fit_us_per_batch(points: list) -> Optional[float]:
    """Least-squares slope of the fetch answer over stored batches, in us per batch."""
    if len(points) < 2:
        return None
    xs, ys = [p.batches for p in points], [p.fetch_ms for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else round(1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 2)


def _end_fetch_ms(fetcher, offset: int, tries: int) -> float:
    """Median answer time of ``tries`` fetches at ``offset`` (a record that is there)."""
    took = []
    for _ in range(tries):
        began = time.monotonic()
        got = fetcher.fetch({0: offset})
        took.append((time.monotonic() - began) * 1000.0)
        if not got:
            raise RuntimeError(f"a fetch at offset {offset} found nothing: the broker needs more than {fetcher.wait.wait_ms} ms")
    return round(statistics.median(took), 2)


def _write(writer, n: int) -> float:
    """Write ``n`` one-record batches; the mean time of one, ms."""
    began = time.monotonic()
    for _ in range(n):
        writer.write([(VALUE, [])])
    return round((time.monotonic() - began) * 1000.0 / max(1, n), 3)


def _log_start(bootstrap: str, topic: str) -> int:
    from kafka import TopicPartition

    from driftstream.engine.connectors.kafka.io import consumer

    c = consumer(bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        return c.beginning_offsets([tp])[tp]
    finally:
        c.close()


def _delete_below(bootstrap: str, topic: str, offset: int, timeout_s: float) -> Optional[str]:
    """Ask the broker to delete the records of ``topic[0]`` below ``offset``; the error, if any."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): offset}, timeout_ms=int(timeout_s * 1000))
        return None
    except KafkaError as exc:
        return repr(exc)
    finally:
        admin.close()


def probe(bootstrap: str, batches: int = 20_000, step: int = 5_000, tries: int = 15, retention_wait_s: float = 10.0,
          topic: str = "broker-log", out=None) -> BrokerLogReport:
    """Measure ``bootstrap`` as the module docstring says. O(batches) writes, a few seconds
    per 10k batches on the local broker."""
    from kafka import KafkaAdminClient

    from driftstream.engine.connectors.kafka.wire import PartitionWriter, TopicFetcher

    say = (lambda line: None) if out is None else (lambda line: print(line, file=out, flush=True))
    report = BrokerLogReport()
    suffix = f"{int(time.time() * 1000) % 10**9}"
    name, retained = f"{topic}-{suffix}", f"{topic}-retention-{suffix}"
    configs = {"retention.ms": "1000", "retention.bytes": "1024", "segment.ms": "500", "segment.bytes": "1024"}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({name: {"num_partitions": 1, "replication_factor": 1},
                             retained: {"num_partitions": 1, "replication_factor": 1, "configs": configs}})
    finally:
        admin.close()
    writer = PartitionWriter(bootstrap, name, 0, client_id="driftstream-broker-log")
    # A wait long enough that the broker always finds the records: this times the broker's work, not a deadline.
    fetcher = TopicFetcher(bootstrap, name, [0], max_wait_ms=2000, client_id="driftstream-broker-log")
    try:
        stored = 0
        while stored < batches:
            n = min(step, batches - stored)
            write_ms = _write(writer, n)
            stored += n
            point = LogPoint(stored, _end_fetch_ms(fetcher, stored - 1, tries), write_ms)
            report.points.append(point)
            say(f"{point.batches:>9,} batches: fetch at the end {point.fetch_ms:7.2f} ms, write {point.write_ms:.3f} ms")
        fetcher.close()  # the broker may drop connections while it fails the deletion
        error = _delete_below(bootstrap, name, stored - 1, timeout_s=10.0)
        start = _log_start(bootstrap, name)
        cut = Truncation(stored - 1, supported=error is None and start == stored - 1, error=error, log_start=start)
        fetcher = TopicFetcher(bootstrap, name, [0], max_wait_ms=2000, client_id="driftstream-broker-log")
        cut.fetch_ms = _end_fetch_ms(fetcher, stored - 1, tries)
        report.truncation = cut
        say(f"DeleteRecords below {cut.requested:,}: {'done' if cut.supported else 'NOT done'}"
            f"{f' ({cut.error})' if cut.error else ''}; log start {cut.log_start:,}; fetch at the end {cut.fetch_ms:.2f} ms")
        writer.close()
        writer = PartitionWriter(bootstrap, retained, 0, client_id="driftstream-broker-log")
        _write(writer, step)
        deadline = time.monotonic() + retention_wait_s
        began = time.monotonic()
        start = _log_start(bootstrap, retained)
        while not start and time.monotonic() < deadline:
            time.sleep(0.5)
            start = _log_start(bootstrap, retained)
        report.retention = Retention(configs, step, round(time.monotonic() - began, 1), start)
        say(f"retention {configs}: log start {start:,} of {step:,} batches after {report.retention.waited_s:g} s "
            f"({'enforced' if report.retention.enforced else 'not enforced'})")
    finally:
        writer.close()
        fetcher.close()
    return report


def summary(report: BrokerLogReport) -> str:
    """One paragraph: the growth per stored batch, then what deletion and retention did."""
    p = report.points
    lines = []
    if p:
        lines.append(f"fetch at the end of the log: {p[0].fetch_ms} ms at {p[0].batches:,} batches, {p[-1].fetch_ms} ms at "
                     f"{p[-1].batches:,} ({fit_us_per_batch(p)} us per stored batch)")
    cut = report.truncation
    if cut is not None:
        lines.append(f"DeleteRecords: {'supported' if cut.supported else 'not supported'}; after it the fetch took {cut.fetch_ms} ms"
                     + (f" (error: {cut.error})" if cut.error else ""))
    if report.retention is not None:
        lines.append(f"retention settings: {'enforced' if report.retention.enforced else 'not enforced'} "
                     f"within {report.retention.waited_s:g} s")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench broker-log", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20_000, help="batches to store (default 20,000)")
    parser.add_argument("--step", type=int, default=5_000, help="batches between two measures (default 5,000)")
    parser.add_argument("--retention-wait", type=float, default=10.0, help="seconds to wait for retention to cut the log (default 10)")
    parser.add_argument("--bootstrap", default=None, help="a Kafka's bootstrap servers (default: a local Tansu for the run)")
    args = parser.parse_args(argv)
    from driftstream.engine.connectors.local_kafka import start_local_kafka

    broker = None if args.bootstrap else start_local_kafka()
    try:
        report = probe(args.bootstrap or broker.bootstrap_servers, args.batches, args.step, retention_wait_s=args.retention_wait, out=sys.stdout)
    finally:
        if broker is not None:
            broker.stop()
    print(summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
