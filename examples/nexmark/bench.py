"""``driftstream bench nexmark``: each query on Ray, exactly-once with 1 s snapshots,
parallelism 2: events/s over a backlog (every event in place at the start), and release
latency at a fixed rate: source emit -> sink acknowledged for a result of the event
itself (q1, q2, q3), and for a window's result (q5, q7, q8) from the moment its window
closed (the watermark reached its close time) -> sink acknowledged.

    driftstream bench nexmark --events 50000 --rate 2000 --seconds 30 [--queries q1,q7]

The events are in a two-partition MemorySource (their source time: each event's ``time``;
the backlog's ``--event-rate`` per second of it, so that it spans many windows) and the
results go to a FileSink; each run's results are checked against a simulator run of the
same query over the same events. Seconds and events/s include starting the actors.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Optional

from driftstream.barriers.file_sink import FileSink, read_file_sink
from driftstream.engine.testing import MemorySource, PacedSource

from .generator import event_time, events
from .queries import QUERIES, build


def run_query(query: str, evs: list, workdir: Path, rate: Optional[float] = None, parallelism: int = 2) -> dict:
    """One run: ``rate`` None for the backlog, else events paced at ``rate`` per second."""
    tag = f"{query}-{'backlog' if rate is None else 'paced'}-{time.time_ns()}"
    source = (MemorySource(evs, partitions=2, timestamp=event_time) if rate is None
              else PacedSource(evs, rate, partitions=2, timestamp=event_time))
    flow = build(query, source, FileSink(workdir / tag, name=query), name=f"nexmark-{tag}")
    started = time.time()
    result = flow.run(parallelism=parallelism, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(workdir / f"snaps-{tag}"))
    seconds = time.time() - started
    got = [p for _, p in read_file_sink(workdir / tag, query)]
    expected = json.loads(json.dumps(build(query, evs).run(runtime="simulator", seed=1).output(query)))
    lat = result.metrics.latency_ms
    return {
        "query": query, "events": len(evs), "mode": "backlog" if rate is None else f"{rate:g} events/s",
        "seconds": round(seconds, 2), "events_per_s": round(len(evs) / seconds, 1), "results": len(got),
        "p50_ms": _ms(lat.get("p50")), "p99_ms": _ms(lat.get("p99")), "snapshots": result.metrics.snapshots, "correct": got == expected,
    }


def _ms(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)


def table(rows: list) -> str:
    """The figures as Markdown.

    >>> print(table([{"query": "q1", "mode": "backlog", "events": 10, "seconds": 1.0, "events_per_s": 10.0,
    ...               "results": 9, "p50_ms": 1.0, "p99_ms": 2.0, "snapshots": 1, "correct": True}]))
    | query | run | events | seconds | events/s | results | p50 ms | p99 ms | snapshots | correct |
    |---|---|---:|---:|---:|---:|---:|---:|---:|---|
    | q1 | backlog | 10 | 1.0 | 10.0 | 9 | 1.0 | 2.0 | 1 | yes |
    """
    lines = ["| query | run | events | seconds | events/s | results | p50 ms | p99 ms | snapshots | correct |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['query']} | {r['mode']} | {r['events']} | {r['seconds']} | {r['events_per_s']} | {r['results']} | "
                     f"{r['p50_ms']} | {r['p99_ms']} | {r['snapshots']} | {'yes' if r['correct'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench nexmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="events of the backlog runs")
    parser.add_argument("--event-rate", type=float, default=200, help="events per second of event time in the backlog (its windows)")
    parser.add_argument("--rate", type=float, default=2_000, help="events/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the latency runs")
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--parallelism", "-p", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    queries = [q for q in args.queries.split(",") if q]
    backlog = events(args.events, rate=args.event_rate)
    paced = events(int(args.rate * args.seconds), rate=args.rate)
    rows = []
    with tempfile.TemporaryDirectory(prefix="nexmark-") as tmp:
        for query in queries:
            for evs, rate in ((backlog, None), (paced, args.rate)):
                row = run_query(query, evs, Path(tmp), rate, args.parallelism)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=1))
    return 0 if all(r["correct"] for r in rows) else 1
