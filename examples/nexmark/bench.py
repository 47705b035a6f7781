"""``driftstream bench nexmark``: each query on Ray, exactly-once with 1 s snapshots,
parallelism 2: events/s over a backlog (every event in place at the start), and latency
at a fixed rate, end to end for both engines the same way: from the input that released
a result arriving (for a window's result, the first event past its end) to the result
visible in the output files (:mod:`.kafka_latency`; ours also reports its own, source emit
-> sink acknowledged).

    driftstream bench nexmark --events 1000000 [--no-latency] [--queries q1,q7] [--no-flink] [--bootstrap HOST:PORT]

**Backlogs, both engines from the same bytes:** the events are written once as JSON lines,
two files (:func:`.flink_queries.write_event_files`); driftstream reads them with a
:class:`~driftstream.engine.connectors.file_source.FileSource` (a partition per file, event
time from each event's ``time``) and Flink's SQL job with its filesystem source. Both
engines' results are checked the same way: as multisets against a direct computation over
the events (:mod:`.direct`). Each engine is timed from its launch and from its first
input read; "start s" is the time between. Flink's launch is its JVM's, the mini
cluster's start included; its first read, both source readers having their file (its
log). Ours: one local Ray session serves every query (started once, its start timed),
and a query's launch figures add that start to ``flow.run``'s time, the actors' start
included, as if each query started its own Ray (a fresh session's first seconds of
background work would otherwise slow the reading it is measured by); its first read is
the first element a source instance read (``Metrics.first_read_at``).

**Latency runs, from the same bytes:** the events in chunks of 0.1 s, each at its due time:
into a Kafka topic for ours (the local Tansu, or ``--bootstrap``), as files renamed into
a directory for Flink (no Kafka jar here); what each engine's reader adds is in its figures.

Flink's figures come beside ours (``--flink``, the default where an interpreter with
pyflink is found, :func:`driftstream.examples.flink_job.flink_python`; ``--no-flink``):
the same queries as Flink SQL (:mod:`.flink_queries`), exactly-once with 1 s checkpoints,
parallelism 2. "events/s after 1st output" (from the first output file, as the inverted
index's Flink baseline reports) leaves its start out too. Its latency is from an event's
file renamed in (a window's: the file that let the watermark pass its end) to the result
committed in a finished part file, at the next checkpoint; its snapshots are its
completed checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import heapq

import orjson

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.barriers.json_payloads import json_bytes
from driftstream.engine.connectors.file_source import FileSource

from ..benchmarks.flames import Flames
from ..inverted_index.files_basis import TreeCpu
from .direct import direct_results
from .flink_queries import check_results, write_event_files
from .generator import event_time, events
from .kafka_latency import run_kafka_latency
from .queries import QUERIES, build, q1_euros, q2_selected


def run_query(query: str, evs: list, workdir: Path, parallelism: int = 2, expected: Optional[list] = None,
              input_dir: Optional[Path] = None, ray_start_s: float = 0.0, flames: Optional[Path] = None) -> dict:
    """The backlog run: ``evs`` read from the JSON-lines files in ``input_dir`` (default:
    written there first), checked against ``expected`` (default: :func:`.direct.direct_results`).
    ``ray_start_s``: the Ray session's start, added to the figures from launch; ``flames``: a
    directory for a py-spy flame graph of each of the run's actors (``<query>-<actor>-<pid>.svg``).
    ``cpu_s``: the CPU seconds of this process's Ray session over the run (None if Ray runs elsewhere)."""
    tag = f"{query}-backlog-{time.time_ns()}"
    if input_dir is None:
        input_dir = workdir / f"events-{tag}"
        write_event_files(evs, input_dir, parallelism)
    source = FileSource(sorted(str(p) for p in Path(input_dir).glob("events-*.json")), timestamp=event_time)
    flow = build(query, source, FileSink(workdir / tag, name=query), name=f"nexmark-{tag}")
    flow.dead_letters(FileSink(workdir / tag, name="dead-letters"))
    launched = time.time() - ray_start_s
    recorders = Flames(flames, match="ray::").follow(f"{query}-") if flames is not None else None
    # The CPU of this process's Ray session (raylet, actors): on a loaded machine the figure to
    # compare runs by, where events/s moves with the load. Sampled once a second: each scan of
    # /proc takes CPU from the run it measures.
    cpu = TreeCpu(every=1.0)
    try:
        result = flow.run(parallelism=parallelism, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(workdir / f"snaps-{tag}"))
    finally:
        cpu_s = cpu.stop()
        if recorders is not None:
            recorders.stop()
    end = time.time()
    got = [p for _, p in read_file_sink(workdir / tag, query)]
    problems = check_results(got, direct_results(query, evs) if expected is None else expected)
    if result.metrics.dead_letters:
        problems.append(f"{result.metrics.dead_letters} dead letter(s)")
    reading = result.metrics.first_read_at
    return {
        "engine": "driftstream", "query": query, "events": len(evs), "mode": "backlog",
        "seconds": round(end - launched, 2), "events_per_s": round(len(evs) / (end - launched), 1),
        "events_per_s_from_reading": round(len(evs) / (end - reading), 1) if reading and end > reading else None,
        "reading_after_s": round(reading - launched, 2) if reading else None, "results": len(got),
        "p50_ms": None, "p99_ms": None, "snapshots": result.metrics.snapshots,
        # None when Ray was started elsewhere (its processes are not this one's descendants)
        "cpu_s": cpu_s or None, "cpu_us_per_event": round(cpu_s / len(evs) * 1e6, 1) if cpu_s else None,
        "correct": not problems, "problems": problems[:10],
    }


def _loop_rows(query: str, evs: list) -> list:
    """The rows of ``query`` as a plain loop computes them: q1 and q2 with the flow's own
    functions, the stateful queries with :mod:`.direct`'s computations (dicts and Counters)."""
    if query == "q1":
        return [q1_euros(e) for e in evs if e["kind"] == "bid"]
    if query == "q2":
        return [{"auction": e["auction"], "price": e["price"]} for e in evs if e["kind"] == "bid" and q2_selected(e)]
    return direct_results(query, evs)


def plain_loop(query: str, input_dir: Path, out: Path) -> dict:
    """The engine overhead ratio's other side: one thread reads the same files, parses each
    line (orjson, as FileSource), merges the files in time order, computes the rows
    (:func:`_loop_rows`) and writes them as JSON lines (as FileSink, one write, one fsync)::

        plain_loop("q1", Path("events"), Path("/tmp/q1.jsonl"))["events_per_s"]
    """
    started = time.perf_counter()
    parsed = []
    for path in sorted(Path(input_dir).glob("events-*.json")):
        with open(path, "rb") as f:
            parsed.append([orjson.loads(line) for line in f])
    evs = list(heapq.merge(*parsed, key=event_time))
    rows = _loop_rows(query, evs)
    with open(out, "wb") as f:
        f.write(b"".join(json_bytes(r) + b"\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    return {"engine": "plain loop (1 thread)", "query": query, "events": len(evs), "mode": "backlog", "seconds": round(seconds, 2),
            "events_per_s": round(len(evs) / seconds, 1), "results": len(rows), "p50_ms": None, "p99_ms": None,
            "correct": not check_results(rows, direct_results(query, evs))}  # fmt: skip


def run_flink(query: str, evs: list, workdir: Path, rate: Optional[float], expected: list, python: str, parallelism: int = 2,
              input_dir: Optional[Path] = None) -> dict:
    """Flink's run of ``query`` (:mod:`.flink_queries`), a job of its own: the backlog (``rate``
    None; from the files in ``input_dir``, default written first) or fed at ``rate``::

        run_flink("q1", evs, Path(tmp), None, direct_results("q1", evs), flink_python())   # a row of table()
    """
    from .flink_queries import run_flink_backlog, run_flink_latency

    work = workdir / f"flink-{query}-{'backlog' if rate is None else 'paced'}-{time.time_ns()}"
    if rate is None:
        return run_flink_backlog([query], evs, work, expected={query: expected}, parallelism=parallelism, python=python, input_dir=input_dir)[0]
    return run_flink_latency(query, evs, work, rate=rate, expected=expected, parallelism=parallelism, python=python)


def _cell(value) -> str:
    return "—" if value is None else str(value)


def table(rows: list) -> str:
    """The figures as Markdown, a row per engine and run: seconds and events/s from launch;
    "start s": launch -> first input read; "from reading": events/s from then; "after 1st
    output": Flink's events/s from its first output file; "overhead ratio": ours from reading
    over the plain loop's (:func:`plain_loop`); snapshots: Flink's checkpoints.

    >>> print(table([{"engine": "driftstream", "query": "q1", "mode": "backlog", "events": 10, "seconds": 1.0, "events_per_s": 10.0,
    ...               "reading_after_s": 0.5, "events_per_s_from_reading": 20.0, "results": 9, "p50_ms": 1.0, "p99_ms": 2.0,
    ...               "snapshots": 1, "correct": True},
    ...              {"engine": "flink", "query": "q1", "mode": "backlog", "events": 10, "seconds": 20.0, "events_per_s": 0.5,
    ...               "events_per_s_after_first_output": 5.0, "events_per_s_from_reading": 4.0, "results": 9, "p50_ms": None,
    ...               "p99_ms": None, "checkpoints": 2, "correct": False}]))
    | engine | query | run | events | seconds | events/s | start s | from reading | after 1st output | overhead ratio | results | p50 ms | p99 ms | snapshots | correct |
    |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
    | driftstream | q1 | backlog | 10 | 1.0 | 10.0 | 0.5 | 20.0 | — | — | 9 | 1.0 | 2.0 | 1 | yes |
    | flink | q1 | backlog | 10 | 20.0 | 0.5 | — | 4.0 | 5.0 | — | 9 | — | — | 2 | NO |
    """
    lines = ["| engine | query | run | events | seconds | events/s | start s | from reading | after 1st output | overhead ratio | results | p50 ms | p99 ms | snapshots | correct |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cells = [r.get("engine", "driftstream"), r["query"], r["mode"], r["events"], r["seconds"], r["events_per_s"], r.get("reading_after_s"),
                 r.get("events_per_s_from_reading"), r.get("events_per_s_after_first_output"), r.get("overhead_ratio"), r["results"], r["p50_ms"], r["p99_ms"],
                 r.get("snapshots", r.get("checkpoints")), "yes" if r["correct"] else "NO"]  # fmt: skip
        lines.append("| " + " | ".join(map(_cell, cells)) + " |")
    return "\n".join(lines)


def _flink_python(wanted: Optional[bool]) -> Optional[str]:
    """The interpreter for Flink's runs, or None: ``--no-flink``, or none found (said in one line; with ``--flink``, an error)."""
    from driftstream.examples.flink_job import flink_python

    if wanted is False:
        return None
    try:
        return flink_python()
    except RuntimeError as e:
        if wanted:
            raise
        print(f"flink left out: {str(e).split(':')[0]} (see driftstream.examples.flink_job; --no-flink to say so)", flush=True)
        return None


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench nexmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="events of the backlog runs")
    parser.add_argument("--event-rate", type=float, default=200, help="events per second of event time in the backlog (its windows)")
    parser.add_argument("--rate", type=float, default=2_000, help="events/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the latency runs")
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--parallelism", "-p", type=int, default=2)
    parser.add_argument("--flink", action=argparse.BooleanOptionalAction, default=None,
                        help="also run Flink's SQL over the same events (default: where an interpreter with pyflink is found)")
    parser.add_argument("--latency", action=argparse.BooleanOptionalAction, default=True, help="the paced latency runs (--no-latency: backlogs only)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers of the latency runs' input (default: start a local broker)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--flames", default=None, metavar="DIR",
                        help="a py-spy flame graph of each actor of our backlog runs, into DIR (needs py-spy and ptrace rights)")
    args = parser.parse_args(argv)
    queries = [q for q in args.queries.split(",") if q]
    python = _flink_python(args.flink)
    from driftstream.engine.runtime.ray_session import ensure_ray

    ray_started = time.time()
    started_here = ensure_ray()
    ray_start_s = round(time.time() - ray_started, 2) if started_here else 0.0
    print(f"Ray session: started in {ray_start_s} s" if started_here else "Ray session: already running (start not counted)", flush=True)
    backlog = events(args.events, rate=args.event_rate)
    paced = events(int(args.rate * args.seconds), rate=args.rate) if args.latency else []
    rows: list = []

    def report(row: dict) -> None:
        print(json.dumps(row), flush=True)
        rows.append(row)

    broker = None
    if args.latency and not args.bootstrap:
        from driftstream.engine.connectors.local_kafka import start_local_kafka

        broker = start_local_kafka()
    bootstrap = args.bootstrap or (broker.bootstrap_servers if broker else None)
    try:
        with tempfile.TemporaryDirectory(prefix="nexmark-") as tmp:
            input_dir = Path(tmp) / "events"  # the backlog's bytes, read by both engines
            write_event_files(backlog, input_dir, args.parallelism)
            for query in queries:
                expected = direct_results(query, backlog)  # one computation checks both engines
                row = run_query(query, backlog, Path(tmp), args.parallelism, expected, input_dir, ray_start_s,
                                flames=Path(args.flames) if args.flames else None)
                loop = plain_loop(query, input_dir, Path(tmp) / f"loop-{query}.jsonl")
                # the engine overhead ratio: the engine's events/s once reading over the loop's
                row["overhead_ratio"] = round(row["events_per_s_from_reading"] / loop["events_per_s"], 3) if row["events_per_s_from_reading"] else None
                report(loop)
                report(row)
                if python:
                    report(run_flink(query, backlog, Path(tmp), None, expected, python, args.parallelism, input_dir))
                if args.latency:
                    expected = direct_results(query, paced)
                    report(run_kafka_latency(query, paced, Path(tmp), rate=args.rate, bootstrap_servers=bootstrap, expected=expected,
                                             parallelism=args.parallelism))
                    if python:
                        report(run_flink(query, paced, Path(tmp), args.rate, expected, python, args.parallelism))
    finally:
        if broker is not None:
            broker.stop()
    print(table(rows))
    if started_here:
        import ray

        ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "ray_start_s": ray_start_s, "rows": rows}, indent=1))
    return 0 if all(r["correct"] for r in rows) else 1
