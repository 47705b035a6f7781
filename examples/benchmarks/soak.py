"""The soak: a Kafka flow with keyed state fed at a steady rate for a long time.

    driftstream bench soak --rate 1000 --seconds 1800                 # local Tansu, exactly-once
    driftstream bench soak --rate 3000 --seconds 600 --bootstrap HOST:PORT

A producer in the driver sends ``rate`` small JSON records a second to a
``partitions``-partition input topic, keyed (each key stays in one partition, as a
keyed Kafka producer does). The flow keeps, per key, the count of its records and
the last 16 characters they carried (``key_by`` -> ``stateful_map`` ->
``KafkaSink``). A checker in the driver reads the output topic as it grows and
verifies every record against the sequential reference: per key the counts must
be exactly 1, 2, 3, ... (nothing lost, nothing twice) and the characters those of
:func:`reference`. Every ``report`` seconds it prints sent, emitted, released,
source lag, the latency of the window (the input record's timestamp to its output
record's: producer, broker, engine and sink), the RSS of every actor and the broker's CPU.

On the local broker the run's length is bounded by Tansu, not by the engine: its
in-memory store lists every batch of a partition on each fetch, so a fetch costs
~0.6-1 us per batch the partition holds, and latency grows with the log. Nothing
the driver can do bounds that log: Tansu 0.6.0 does not implement DeleteRecords
and does not enforce ``retention.ms`` / ``retention.bytes`` (``driftstream bench
broker-log`` shows both; figures in ``examples/benchmarks/README.md``).

>>> reference(0, 3), reference(1, 1)
('aho', 'b')
>>> len(reference(2, 40))
16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

#: Characters carried per key: record n of key k carries ``ALPHABET[(k + 7 * (n - 1)) % 26]``.
ALPHABET = "abcdefghijklmnopqrstuvwxyz"

#: Characters of state kept per key.
KEEP = 16


def char(key: int, n: int) -> str:
    """The character record ``n`` (1-based) of key ``key`` carries."""
    return ALPHABET[(key + 7 * (n - 1)) % 26]


def reference(key: int, n: int) -> str:
    """The state after key ``key``'s first ``n`` records, computed sequentially."""
    return "".join(char(key, i) for i in range(max(1, n - KEEP + 1), n + 1))


def last_chars(state: Optional[tuple], record: dict) -> tuple:
    """The soak's stateful step: ``(count, last 16 characters)`` per key."""
    count, chars = state or (0, "")
    count, chars = count + 1, (chars + record["c"])[-KEEP:]
    return (count, chars), {"k": record["k"], "n": count, "s": chars}


def record_key(record: dict) -> int:
    return record["k"]


@dataclass
class SoakConfig:
    """One soak run. ``bootstrap`` None: a local Tansu broker for the run."""

    rate: float = 1000.0
    seconds: float = 120.0
    keys: int = 13
    partitions: int = 2
    parallelism: int = 2
    guarantee: str = "exactly-once"
    snapshot_interval: float = 1.0
    snapshot_dir: Optional[str] = None
    bootstrap: Optional[str] = None
    linger_ms: int = 5
    report_s: float = 10.0
    compare_s: float = 300.0
    drain_s: float = 120.0
    topic: str = "soak-in"
    quiet: bool = False


@dataclass
class SoakRow:
    """One report line: counters at ``at_s`` seconds and the window's figures."""

    at_s: float
    sent: int
    emitted: int
    released: int
    source_lag: Optional[int]
    checked: int
    latency_p50_ms: Optional[float]
    latency_p99_ms: Optional[float]
    fetch_ms: list
    actor_rss_mb: dict
    broker_cpu: Optional[float]
    latency_p95_ms: Optional[float] = None
    host_cpu: float = 0.0  # the whole machine's, % of all its cores
    other_cpu: float = 0.0  # of it, what went outside this run (another user's work slows every window)
    queue_ms: Optional[float] = None  # the producer's mean time from send to request: its linger
    #: the engine's own release latency (source emit -> sink acknowledged) over the elements
    #: released in the last 10 s, from status()["latency_ms"]: the producer and the fetch of the
    #: element itself are not in it, but a release waits for the watermark, the minimum over the
    #: partitions, so the slower partition's next fetch is
    engine_p50_ms: Optional[float] = None
    engine_p95_ms: Optional[float] = None
    engine_p99_ms: Optional[float] = None


@dataclass
class SoakReport:
    """What a soak run showed. ``ok``: every record released exactly once with the right state."""

    config: SoakConfig
    rows: list = field(default_factory=list)
    sent: int = 0
    checked: int = 0
    duplicates: int = 0
    missing: int = 0
    wrong: int = 0
    max_source_lag: int = 0
    status: dict = field(default_factory=dict)
    engine_latency_ms: dict = field(default_factory=dict)  # source emit -> sink acknowledged, over the run

    @property
    def ok(self) -> bool:
        return self.sent > 0 and self.checked == self.sent and not (self.duplicates or self.missing or self.wrong)


class Feeder(threading.Thread):
    """Sends ``rate`` records a second, scheduled on the clock (a late send catches up)."""

    def __init__(self, cfg: SoakConfig, bootstrap: str) -> None:
        super().__init__(name="soak-feeder", daemon=True)
        from kafka import KafkaProducer

        self.cfg = cfg
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=cfg.linger_ms, acks=1)
        self.sent_per_key = [0] * cfg.keys
        self.sent = 0
        self.stopping = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        cfg, send = self.cfg, self.producer.send
        began = time.monotonic()
        try:
            while not self.stopping.is_set():
                due = min(int((time.monotonic() - began) * cfg.rate), int(cfg.seconds * cfg.rate))
                while self.sent < due:
                    k = self.sent % cfg.keys
                    n = self.sent_per_key[k] = self.sent_per_key[k] + 1
                    value = json.dumps({"k": k, "c": char(k, n)}, separators=(",", ":")).encode()
                    send(cfg.topic, value=value, partition=k % cfg.partitions)
                    self.sent += 1
                if due >= cfg.seconds * cfg.rate:
                    break
                self.stopping.wait(0.002)
            self.producer.flush()
        except BaseException as exc:  # reported by run_soak
            self.error = exc
        finally:
            self.producer.close()

    def queue_ms(self) -> Optional[float]:
        """How long the producer's batches waited, from their first record to their request
        (its linger), mean over its metrics window (~30-60 s); None if it keeps no metrics."""
        try:
            value = (self.producer.metrics() or {}).get("producer-metrics", {}).get("record-queue-time-avg")
        except Exception:  # metrics are an unstable interface of kafka-python: a figure, not a failure
            return None
        return None if value is None or value != value else round(1000.0 * value, 1)  # seconds; NaN before the first batch


class Checker(threading.Thread):
    """Reads the output topic and checks each record against :func:`reference`; the
    latency of a record is its input's timestamp (the producer's clock) to its own (the
    sink's clock when it wrote it): everything from the producer to the output topic.

    Per key the counts must come as 1, 2, 3, ...: a count seen again is a duplicate, a
    count skipped is missing, a state that differs from the reference is wrong.
    """

    #: Seconds between two reads: each costs a broker that scans its log (Tansu) ~1 us per batch.
    POLL_S = 0.5

    def __init__(self, cfg: SoakConfig, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="soak-checker", daemon=True)
        from driftstream.engine.connectors.kafka.wire import TopicFetcher

        self.fetcher = TopicFetcher(bootstrap, topic, list(range(partitions)), max_wait_ms=20, client_id="driftstream-soak")
        self.next_n = [1] * cfg.keys
        self.checked = self.duplicates = self.missing = self.wrong = 0
        self.latencies: list = []  # of the current report window, ms
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        from driftstream.engine.connectors.kafka.sink import meta_of

        offsets = {p: 0 for p in self.fetcher.partitions}
        try:
            while not self.stopping.is_set():
                got = self.fetcher.fetch(offsets)
                for p, records in got.items():
                    offsets[p] = records[-1].offset + 1
                    for rec in records:
                        out = json.loads(rec.value)
                        # The sink stamps each record when it writes it: the latency does not
                        # depend on how often this checker reads.
                        self._check(out, rec.timestamp - meta_of(rec).ts)
                self.stopping.wait(max(self.fetcher.wait.pause_s, self.POLL_S))
        except BaseException as exc:
            self.error = exc
        finally:
            self.fetcher.close()

    def _check(self, out: dict, latency_ms: float) -> None:
        k, n = out["k"], out["n"]
        with self.lock:
            expected = self.next_n[k]
            if n < expected:
                self.duplicates += 1
                return
            if n > expected:
                self.missing += n - expected
            self.next_n[k] = n + 1
            self.checked += 1
            if out["s"] != reference(k, n):
                self.wrong += 1
            self.latencies.append(latency_ms)

    def take_window(self) -> list:
        with self.lock:
            window, self.latencies = self.latencies, []
        return window


class OtherLoad:
    """The CPU this machine spent outside the run between two samples, % of all its cores:
    the host's busy time less this driver's and its descendants' (the local Ray's
    processes and the local broker). On a shared machine, what others took from the run.

    psutil measures a process's CPU between two calls on the same ``Process`` object, so
    the objects are kept from sample to sample; a process seen for the first time counts
    from then on (its CPU before that goes to "other"). O(processes of the run) a sample.
    """

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.procs: dict = {}
        self.host = 0.0
        self.sample()

    def sample(self) -> float:
        """The others' CPU since the last sample, % of all cores (``self.host``: the host's)."""
        import psutil

        self.host = psutil.cpu_percent()
        own, kept = 0.0, {}
        for proc in [self.me, *self.me.children(recursive=True)]:
            proc = self.procs.get(proc.pid, proc)
            try:
                own += proc.cpu_percent()
            except psutil.Error:  # exited meanwhile
                continue
            kept[proc.pid] = proc
        self.procs = kept
        return round(max(0.0, self.host - own / (psutil.cpu_count() or 1)), 0)


#: The engine's actor classes, as Ray titles their processes (``ray::StageActor.run``).
ACTOR_CLASSES = ("StageActor", "AckerActor", "CoordinatorActor")


def actor_rss_mb() -> dict:
    """RSS (MiB) of this run's driftstream actor processes, by class and pid.

    A local Ray started by this driver runs its workers as the driver's descendants, so
    only those count: other runs on a shared machine have actors of the same classes.
    With none among them (the run joined a Ray cluster), every such actor of this machine."""
    import psutil

    def actors(procs: Any) -> dict:
        out: dict = {}
        for proc in procs:
            try:
                cmd, rss = proc.cmdline(), proc.memory_info().rss
            except psutil.Error:  # gone, or not ours to read
                continue
            title = cmd[0].split(".")[0].replace("ray::", "") if cmd else ""
            if title in ACTOR_CLASSES:
                out[f"{title}#{proc.pid}"] = round(rss / 2**20, 1)
        return out

    return actors(psutil.Process().children(recursive=True)) or actors(psutil.process_iter())


def build_flow(cfg: SoakConfig, bootstrap: str, out_topic: str) -> Any:
    from driftstream.engine import Flow, KafkaSink, KafkaSource

    flow = Flow("soak")
    (
        flow.source(KafkaSource(cfg.topic, bootstrap), name="records")
        .key_by(record_key, name="by_key")
        .stateful_map(last_chars, name="last_chars")
        .sink(KafkaSink(out_topic, bootstrap), name="out")
    )
    return flow


def _median_or_none(xs: list) -> Optional[float]:
    """The upper median of ``xs`` (one of its values), None if empty."""
    return statistics.median_high(xs) if xs else None


def _pct(values: list, p: int) -> Optional[float]:
    from driftstream.engine.model.result import percentiles

    got = percentiles(values, (p,))
    return None if not got.get("count") else round(got[f"p{p}"], 1)


def run_soak(cfg: SoakConfig, out=sys.stdout) -> SoakReport:
    """Run one soak and return its report (see the module docstring)."""
    import tempfile

    import psutil

    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.local_kafka import start_local_kafka

    broker = None if cfg.bootstrap else start_local_kafka()
    bootstrap = cfg.bootstrap or broker.bootstrap_servers
    broker_proc = psutil.Process(broker.process.pid) if broker else None
    report = SoakReport(cfg)
    out_topic = f"{cfg.topic}-out"
    snapshot_dir = cfg.snapshot_dir or tempfile.mkdtemp(prefix="driftstream-soak-")
    say = (lambda *a: None) if cfg.quiet else (lambda line: print(line, file=out, flush=True))
    handle = feeder = checker = None
    try:
        ensure_topic(bootstrap, cfg.topic, cfg.partitions)
        ensure_topic(bootstrap, out_topic, cfg.parallelism)
        flow = build_flow(cfg, bootstrap, out_topic)
        snapshots = {} if cfg.guarantee == "none" else {"snapshot_interval": cfg.snapshot_interval, "snapshot_dir": snapshot_dir}
        handle = flow.start(parallelism=cfg.parallelism, guarantee=cfg.guarantee, **snapshots)
        checker = Checker(cfg, bootstrap, out_topic, cfg.parallelism)
        feeder = Feeder(cfg, bootstrap)
        if broker_proc:
            broker_proc.cpu_percent()
        load = OtherLoad()
        say(f"soak: {cfg.rate:,.0f} records/s for {cfg.seconds:g} s, {cfg.keys} keys, {cfg.partitions} partitions, "
            f"parallelism {cfg.parallelism}, {cfg.guarantee}, broker {bootstrap}{' (local Tansu)' if broker else ''}")
        say(f"{'s':>6} {'sent':>10} {'emitted':>10} {'released':>10} {'lag':>7} {'checked':>10} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
            f"{'queue':>6} {'fetch ms':>10} {'broker':>7} {'host':>6} {'other':>6}  actor RSS MiB")
        checker.start()
        feeder.start()
        began = time.monotonic()
        next_report = cfg.report_s
        drain_deadline = None
        while True:
            time.sleep(0.2)
            for thread in (feeder, checker):
                if thread.error is not None:
                    raise RuntimeError(f"the soak's {thread.name} failed: {thread.error!r}") from thread.error
            elapsed = time.monotonic() - began
            if elapsed >= next_report:
                next_report += cfg.report_s
                row = _row(handle, feeder, checker, broker_proc, load, elapsed)
                report.rows.append(row)
                report.max_source_lag = max(report.max_source_lag, row.source_lag or 0)
                say(_format_row(row))
            if not feeder.is_alive():
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + cfg.drain_s
                if checker.checked + checker.duplicates >= feeder.sent or time.monotonic() > drain_deadline:
                    break
        report.status = handle.status()
    finally:
        for thread in (feeder, checker):
            if thread is not None:
                thread.stopping.set()
                if thread.is_alive():
                    thread.join(timeout=30)
        if handle is not None:
            try:
                report.engine_latency_ms = dict(handle.stop(timeout=120).metrics.latency_ms)
            except Exception as exc:  # the figures are still worth reporting
                say(f"soak: stopping the flow failed: {exc!r}")
        if broker is not None:
            broker.stop()
    report.sent = feeder.sent
    report.checked, report.duplicates, report.wrong = checker.checked, checker.duplicates, checker.wrong
    report.missing = checker.missing + sum(sent - (nxt - 1) for sent, nxt in zip(feeder.sent_per_key, checker.next_n))
    return report


def _row(handle: Any, feeder: Feeder, checker: Checker, broker_proc: Any, load: OtherLoad, elapsed: float) -> SoakRow:
    st = handle.status()
    other = load.sample()
    window = checker.take_window()
    engine = st.get("latency_ms") or {}
    return SoakRow(
        at_s=round(elapsed, 1),
        sent=feeder.sent,
        emitted=st.get("emitted", 0),
        released=st.get("released", 0),
        source_lag=st.get("source_lag"),
        checked=checker.checked,
        latency_p50_ms=_pct(window, 50),
        latency_p95_ms=_pct(window, 95),
        latency_p99_ms=_pct(window, 99),
        fetch_ms=[p["fetch_ms"] for p in st.get("source_partitions", [])],
        actor_rss_mb=actor_rss_mb(),
        broker_cpu=None if broker_proc is None else round(broker_proc.cpu_percent(), 0),
        host_cpu=round(load.host, 0),
        other_cpu=other,
        queue_ms=feeder.queue_ms(),
        engine_p50_ms=_round1(engine.get("p50")),
        engine_p95_ms=_round1(engine.get("p95")),
        engine_p99_ms=_round1(engine.get("p99")),
    )


def _round1(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 1)


def _or_dash(x: Any) -> Any:
    return "-" if x is None else x


def _format_row(r: SoakRow) -> str:
    rss = " ".join(f"{v:.0f}" for _, v in sorted(r.actor_rss_mb.items()))
    fetch = "/".join(f"{x:.0f}" for x in r.fetch_ms) or "-"
    cpu = "-" if r.broker_cpu is None else f"{r.broker_cpu:.0f}%"
    return (f"{r.at_s:6.0f} {r.sent:10,} {r.emitted:10,} {r.released:10,} {_or_dash(r.source_lag):>7} "
            f"{r.checked:10,} {_or_dash(r.latency_p50_ms):>8} {_or_dash(r.latency_p95_ms):>8} {_or_dash(r.latency_p99_ms):>8} "
            f"{_or_dash(r.queue_ms):>6} {fetch:>10} {cpu:>7} {r.host_cpu:>5.0f}% {r.other_cpu:>5.0f}%  {rss}")


def compare_latency(label: str, prefix: str, first: list, last: list) -> str:
    """p50 / p95 / p99 of the first and last rows (the medians of their windows' figures,
    ``<prefix>_p<N>_ms``), and the change from first to last.

    >>> rows = [SoakRow(0, 0, 0, 0, None, 0, None, None, [], {}, None, engine_p50_ms=v, engine_p95_ms=v, engine_p99_ms=v)
    ...         for v in (10.0, 12.0, 11.0, 10.5)]
    >>> compare_latency("engine", "engine", rows[:3], rows[3:])
    'engine p50 / p95 / p99 ms: first 11.0 / 11.0 / 11.0, last 10.5 / 10.5 / 10.5: p50 -5%, p95 -5%, p99 -5% (within 10%)'
    """
    medians = {}
    for side, part in (("first", first), ("last", last)):
        medians[side] = {p: _median_or_none([getattr(r, f"{prefix}_p{p}_ms") for r in part if getattr(r, f"{prefix}_p{p}_ms") is not None])
                         for p in (50, 95, 99)}
    return compare_figures(label, medians["first"], medians["last"])


def compare_figures(label: str, first: dict, last: dict) -> str:
    """``{50: p50, 95: p95, 99: p99}`` (ms) of a run's first and last span, and the change.

    >>> compare_figures("emit -> release", {50: 2.0, 95: 4.0, 99: 6.0}, {50: 2.1, 95: 4.0, 99: 7.2})
    'emit -> release p50 / p95 / p99 ms: first 2.0 / 4.0 / 6.0, last 2.1 / 4.0 / 7.2: p50 +5%, p95 +0%, p99 +20%'
    """
    growth = {p: None if not (first[p] and last[p]) else round(100.0 * (last[p] / first[p] - 1.0)) for p in (50, 95, 99)}
    return (f"{label} p50 / p95 / p99 ms: "
            + ", ".join(f"{side} " + " / ".join(str(v) for v in figures.values()) for side, figures in (("first", first), ("last", last)))
            + ": " + ", ".join(f"p{p} {'-' if g is None else f'{g:+d}%'}" for p, g in growth.items())
            + (" (within 10%)" if all(g is not None and abs(g) <= 10 for g in growth.values()) else ""))


def summary(report: SoakReport) -> str:
    """The verdict and the figures the issue asks for: first vs last 5 minutes, RSS, broker CPU."""
    rows = report.rows
    lines = [
        f"sent {report.sent:,}, checked {report.checked:,}: duplicates {report.duplicates}, missing {report.missing}, "
        f"wrong state {report.wrong} -> {'EXACTLY ONCE' if report.ok else 'FAILED'}",
        f"max source lag {report.max_source_lag:,} records",
        "engine release latency over the run (source emit -> sink acknowledged, ms): "
        + ", ".join(f"{k} {v:.1f}" for k, v in report.engine_latency_ms.items() if k != "count"),
    ]
    if rows:
        span = min(report.config.compare_s, rows[-1].at_s / 2)
        first = [r for r in rows if r.at_s <= span]
        last = [r for r in rows if r.at_s > rows[-1].at_s - span]
        for label, part in (("first", first), ("last", last)):
            cpu = [r.broker_cpu for r in part if r.broker_cpu is not None]
            lines.append(
                f"{label} {span:.0f} s: broker CPU mean {statistics.fmean(cpu) if cpu else float('nan'):.0f}%, host CPU mean "
                f"{statistics.fmean(r.host_cpu for r in part):.0f}% ({statistics.fmean(r.other_cpu for r in part):.0f}% outside the run)"
            )
        lines.append(compare_latency("end to end (producer -> output record)", "latency", first, last))
        lines.append(compare_latency("engine (source emit -> sink acknowledged)", "engine", first, last))
        warm = rows[min(len(rows) - 1, max(1, len(rows) // 10))].actor_rss_mb
        end = rows[-1].actor_rss_mb
        growth = {name: round(end[name] - warm[name], 1) for name in end if name in warm}
        lines.append(f"actor RSS growth after warm-up (MiB): {growth}")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench soak", description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SoakConfig()
    parser.add_argument("--rate", type=float, default=d.rate, help=f"records/s (default {d.rate:g})")
    parser.add_argument("--seconds", type=float, default=d.seconds, help=f"seconds of input (default {d.seconds:g})")
    parser.add_argument("--keys", type=int, default=d.keys)
    parser.add_argument("--partitions", type=int, default=d.partitions, help="input topic partitions")
    parser.add_argument("--parallelism", "-p", type=int, default=d.parallelism)
    parser.add_argument("--guarantee", default=d.guarantee, choices=["none", "at-most-once", "at-least-once", "exactly-once"])
    parser.add_argument("--snapshot-interval", type=float, default=d.snapshot_interval)
    parser.add_argument("--snapshot-dir", default=None)
    parser.add_argument("--bootstrap", default=None, help="a Kafka's bootstrap servers (default: a local Tansu for the run)")
    parser.add_argument("--linger-ms", type=int, default=d.linger_ms, help="the producer's linger.ms (default 5, Kafka 4's)")
    parser.add_argument("--report", type=float, default=d.report_s, help="seconds between report lines")
    parser.add_argument("--compare", type=float, default=d.compare_s,
                        help=f"seconds at the start and at the end whose latency the summary compares (default {d.compare_s:g}; at most half the run)")
    parser.add_argument("--json", default=None, help="also write the rows and verdict to this file")
    args = parser.parse_args(argv)
    cfg = SoakConfig(
        rate=args.rate, seconds=args.seconds, keys=args.keys, partitions=args.partitions, parallelism=args.parallelism,
        guarantee=args.guarantee, snapshot_interval=args.snapshot_interval, snapshot_dir=args.snapshot_dir,
        bootstrap=args.bootstrap, linger_ms=args.linger_ms, report_s=args.report, compare_s=args.compare,
    )
    for key, value in {"RAY_task_events_report_interval_ms": "0", "RAY_enable_metrics_collection": "0", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        os.environ.setdefault(key, value)
    report = run_soak(cfg)
    print(summary(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": asdict(cfg), "rows": [asdict(r) for r in report.rows], "ok": report.ok, "sent": report.sent,
                       "checked": report.checked, "duplicates": report.duplicates, "missing": report.missing, "wrong": report.wrong,
                       "status": report.status}, fh, indent=1, default=str)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
