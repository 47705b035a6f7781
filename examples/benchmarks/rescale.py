"""``driftstream bench rescale``: how long a rescale stops the output, and that it changes none of it.

    driftstream bench rescale                         # 2 -> 3 -> 2, three times, on this machine's Ray
    driftstream bench rescale --cluster               # the same on a two-node ray.cluster_utils.Cluster
    driftstream bench rescale --steps 2,3,2 --warmup 10 --seconds 12 --json rescale.json

The workload is the inverted-index benchmark's (:mod:`driftstream.examples.inverted_index.benchmark`):
the corpus slice fed at ``--rate`` docs/s (Poisson arrivals) into a one-partition input
topic of the local Tansu broker (or ``--bootstrap``), the index flow exactly-once with
1 s snapshots, started at the first of ``--steps``; after ``--warmup`` seconds of input
``handle.rescale`` moves it to the next step, then every ``--seconds`` to the one after.
The output topic has as many partitions as the largest step (each instance writes its
own partition). At the end the change records are checked against the PySpark ground
truth, as ``driftstream demo`` does: a rescale must not change them.

Downtime, per rescale, is measured where a user sees it: by the benchmark's measuring
consumer (:class:`~driftstream.examples.inverted_index.measure.OutputMeter`, its own
process), which stamps each record of the output topic with its receive wall time, as
the latency figures do. Between the drained snapshot's commit and the end of the
restart no output can come, so the records on either side of that stretch are the last
output before the rescale and the first after it; downtime = their receive times apart
(:func:`~driftstream.examples.inverted_index.benchmark.rescale_downtimes`). The engine's
own figures are printed beside it: ``drain_s`` (the sources' stop to the drained
snapshot's commit), ``restart_s`` (from there to every actor running again) and
``first_output_s`` (the sources' stop to the first bundle a sink wrote after it), from
``handle.rescale``'s report. The consumer's figure includes what the engine's do not:
the last records' way to the broker and the consumer before the stop, and the first
ones' after.

``--standbys N`` keeps N spare actors started (``standbys=N``): a rescale to more
instances resets one in each new instance's place instead of starting a process. Each
rescale's line also says where ``restart_s`` went (the report's ``steps_s``: reassign,
kill, reset, connect, start; and each survivor's reset).

``--cluster`` starts a Ray cluster of a head and one worker node on this machine
(``ray.cluster_utils.Cluster``, one CPU each, as ``tests/engine/control/cluster_run.py``
does) and runs the same there: Ray spreads the actors over both nodes, and a rescale to
more instances starts the new ones on either. The actors' nodes after each rescale are
printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional


def parallelisms(text: str) -> list:
    """``--steps``: the parallelism at the start, then after each rescale.

    >>> parallelisms("2,3,2")
    [2, 3, 2]
    """
    steps = [int(x) for x in text.split(",") if x.strip()]
    if len(steps) < 2 or any(p < 1 for p in steps) or any(a == b for a, b in zip(steps, steps[1:])):
        raise argparse.ArgumentTypeError(f"--steps needs at least two parallelisms >= 1, each differing from the one before: {text!r}")
    return steps


def schedule(steps: list, warmup: float, seconds: float) -> tuple:
    """``(rescale_at, feed seconds)``: a rescale to each step after the first, the first after
    ``warmup`` seconds of input, the next ones ``seconds`` apart; the input goes on for
    ``seconds`` after the last.

    >>> schedule([2, 3, 2], warmup=10, seconds=8)
    ([(10.0, 3), (18.0, 2)], 26.0)
    """
    at = [(float(warmup + k * seconds), p) for k, p in enumerate(steps[1:])]
    return at, float(warmup + (len(steps) - 1) * seconds)


def by_direction(rescales: list) -> dict:
    """Per direction (``"2->3"``), each figure's values in the order they came, and their median.

    >>> r = by_direction([{"from": 2, "to": 3, "downtime_s": 0.5, "drain_s": 0.1, "restart_s": 0.3, "first_output_s": 0.45},
    ...                   {"from": 2, "to": 3, "downtime_s": 0.7, "drain_s": 0.1, "restart_s": 0.5, "first_output_s": 0.6}])
    >>> r["2->3"]["downtime_s"]
    {'values': [0.5, 0.7], 'median': 0.6, 'min': 0.5, 'max': 0.7}
    """
    out: dict = {}
    for r in rescales:
        d = out.setdefault(f"{r['from']}->{r['to']}", {})
        for k in ("downtime_s", "drain_s", "restart_s", "first_output_s", "latency_back_under_p99_s"):
            if r.get(k) is not None:
                d.setdefault(k, {"values": []})["values"].append(round(r[k], 3))
    for d in out.values():
        for v in d.values():
            v.update(median=round(statistics.median(v["values"]), 3), min=min(v["values"]), max=max(v["values"]))
    return out


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f} s"


def format_rescale(r: dict) -> str:
    """One rescale's lines."""
    from driftstream.engine.cli.status_view import recovery_resets, recovery_steps

    line = (f"{r['from']} -> {r['to']} at {r['called_at_s']:.1f} s: downtime {_s(r['downtime_s'])} at the consumer "
            f"(largest gap in the 5 s before: {_s(r['baseline_gap_s'])}); engine: drain {_s(r['drain_s'])}, restart "
            f"{_s(r['restart_s'])}, first output {_s(r['first_output_s'])} after the sources' stop; rescale() returned after "
            f"{_s(r['returned_after_s'])}; latency back under the pre-rescale p99 {_s(r.get('latency_back_under_p99_s'))} after the stop")
    if r.get("steps_s"):
        line += "\n    restart: " + recovery_steps(r["steps_s"])
        if r.get("resets_s"):
            line += "; resets: " + recovery_resets(r["resets_s"])
    if r.get("placement"):
        line += "\n    actors per node after it: " + ", ".join(f"{node}: {n}" for node, n in sorted(r["placement"].items()))
    return line


def format_summary(directions: dict) -> str:
    lines = []
    for direction, figures in directions.items():
        parts = []
        for k, name in (("downtime_s", "downtime"), ("drain_s", "drain"), ("restart_s", "restart"), ("first_output_s", "first output")):
            v = figures.get(k)
            if v:
                parts.append(f"{name} {v['median']:.3f} s ({v['min']:.3f}-{v['max']:.3f})")
        n = len(figures.get("restart_s", {}).get("values", []))
        lines.append(f"{direction}, {n} rescale(s), median (range): " + ", ".join(parts))
    return "\n".join(lines)


@contextlib.contextmanager
def two_node_cluster():
    """A head and one worker node on this machine, one CPU each, the driver connected; shut
    down after. Under its own short ``RAY_TMPDIR`` (see ``tests/engine/control/cluster_run.py``:
    another process's ``ray.init()`` must not find this cluster)."""
    from driftstream.engine.runtime.ray_session import LEAN_RAY_ENV, NAMESPACE

    for k, v in LEAN_RAY_ENV.items():
        os.environ.setdefault(k, v)
    own = "RAY_TMPDIR" not in os.environ
    if own:
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="dsr-", dir="/tmp")
    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    try:
        store = 256 * 1024 * 1024
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": store})
        cluster.add_node(num_cpus=1, object_store_memory=store)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, configure_logging=False)
        yield cluster
    finally:
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()
            if own:
                shutil.rmtree(os.environ.pop("RAY_TMPDIR"), ignore_errors=True)


def main(argv: Optional[list] = None) -> int:
    """``driftstream bench rescale``."""
    from rich.console import Console

    from driftstream.examples.inverted_index import benchmark as ii

    parser = argparse.ArgumentParser(
        prog="driftstream bench rescale",
        description="the inverted index exactly-once at a steady rate, rescaled while it runs: downtime at the output "
        "topic's consumer and the engine's drain / restart / first output, output checked against the PySpark ground truth",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: start a local broker)")
    parser.add_argument("--source", default="ovos", help="corpus: ovos (default), a MediaWiki XML(.bz2) dump or a text dir")
    parser.add_argument("--rate", type=float, default=50.0, help="docs/s (default 50)")
    parser.add_argument("--steps", type=parallelisms, default=[2, 3, 2, 3, 2, 3, 2],
                        help="the parallelism at the start, then after each rescale (default 2,3,2,3,2,3,2)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of input before the first rescale (default 10)")
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="seconds of input between two rescales, and after the last (default 12: the pre-rescale p99 is over "
                        "the 10 s before a rescale)")
    parser.add_argument("--snapshot-interval", type=float, default=1.0, help="seconds between snapshots (default 1)")
    parser.add_argument("--standbys", type=int, default=0,
                        help="spare actors (default 0): a rescale to more instances resets one in a new instance's place")
    parser.add_argument("--skip", type=int, default=200, help="documents left out of the latency percentiles (default 200)")
    parser.add_argument("--cluster", action="store_true", help="on a two-node ray.cluster_utils.Cluster (head + one worker node)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "driftstream-bench"))
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    console = Console()
    load = os.getloadavg()[0]
    started = time.time()
    rescale_at, feed_s = schedule(args.steps, args.warmup, args.seconds)
    docs = int(args.rate * (feed_s + args.seconds))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    from driftstream.engine.connectors.local_kafka import start_local_kafka
    from driftstream.engine.runtime.ray_session import ensure_ray

    corpus, truth = ii.prepare(workdir, docs, args.source, console=console)
    broker = None if args.bootstrap else start_local_kafka()
    bootstrap = args.bootstrap or broker.bootstrap_servers
    print(f"rescale bench: inverted index, {args.rate:g} docs/s, {docs} documents, exactly-once, snapshots every "
          f"{args.snapshot_interval:g} s, {args.standbys} standby(s), parallelism {' -> '.join(map(str, args.steps))} (rescales at "
          f"{', '.join(f'{s:g}' for s, _ in rescale_at)} s of input), broker {bootstrap}, "
          + ("two-node Ray cluster (head + one worker node)" if args.cluster else "local Ray"), flush=True)
    started_ray = False
    try:
        with (two_node_cluster() if args.cluster else contextlib.nullcontext()):
            started_ray = ensure_ray(None)
            bench = ii.Benchmark(corpus, bootstrap, truth=truth, skip=args.skip, workdir=str(workdir))
            config = ii.Config("driftstream", "exactly-once", args.snapshot_interval, standbys=args.standbys,
                               parallelism=args.steps[0], export_metrics=False)
            run = bench.run(config, rate=args.rate, docs=docs, rescale_at=tuple(rescale_at))
            if started_ray:
                import ray

                ray.shutdown()
                started_ray = False
    finally:
        if started_ray:
            import ray

            ray.shutdown()
        if broker is not None:
            broker.stop()
    for r in run.rescales:
        print(format_rescale(r))
    directions = by_direction(run.rescales)
    print(format_summary(directions))
    lat = run.latency_ms
    print(f"document latency over the run (first {args.skip} skipped, rescales included): "
          + ", ".join(f"{q} {lat.get(q, float('nan')):.1f} ms" for q in ("p50", "p75", "p95", "p99", "max")) + f" over {lat.get('count', 0)} docs")
    ok = run.correct and len(run.rescales) == len(rescale_at) and all(r["downtime_s"] is not None for r in run.rescales)
    for p in run.problems[:10]:
        print(f"problem: {p}")
    print(f"output: {run.records} change records, {run.duplicates} duplicate(s), {run.incomplete} incomplete document(s); "
          + ("equals the PySpark ground truth" if run.correct else "DIFFERS from the PySpark ground truth"))
    print(f"load average (1 min) before {load:.2f}, after {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; total bench time {time.time() - started:.1f} s")
    if args.json:
        figures = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)), "cluster": args.cluster, "rate": args.rate,
                   "docs": docs, "steps": args.steps, "warmup": args.warmup, "seconds": args.seconds,
                   "snapshot_interval": args.snapshot_interval, "standbys": args.standbys, "rescales": run.rescales, "by_direction": directions,
                   "latency_ms": lat, "correct": run.correct, "problems": run.problems[:10], "records": run.records,
                   "load_average_1min": {"before": load, "after": os.getloadavg()[0]}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=1))
        print(f"results: {args.json}")
    return 0 if ok else 1
