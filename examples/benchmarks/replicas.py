"""``driftstream bench replicas``: replicas on Ray (``replicas=2``, ``verify="first"``), a
stateful instance's primary killed, in one invocation.

    driftstream bench replicas                        # parallelism 2, 300 elements/s for 8 s, kill at 4 s
    driftstream bench replicas --repeat 3 --json replicas.json

The flow is the local-recovery bench's (:func:`~driftstream.examples.benchmarks.local_recovery.
flow_of`: a scheduled source, ``key_by``, a rolling hash per key, a file sink noting when and by
which process each bundle is durable), exactly-once under ``recovery="local"``. Per round:

- at ``--rate``: replicas=2 with no failure, then with the primary of ``by_key/1`` killed
  ``--kill-at`` seconds in: the longest gap between two bundles of any partition (the killed
  one's included, from 1 s after the first), the killed partition's first output by another
  process, ``metrics.restores`` and the recovery's kind; the output checked against replicas=1's;
- a backlog of ``--backlog`` elements (all available at once) with replicas=1 and =2: elements/s
  from the schedule's start to the last bundle durable, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Optional

from driftstream.examples.benchmarks.local_recovery import VICTIM, one_run, run_options

#: a rate at which the whole backlog is available at the schedule's start
BACKLOG_RATE = 1e6


def run(name: str, replicas: int, kill_at: Optional[float], args: argparse.Namespace, root: str, rate: float, seconds: float) -> dict:
    """:func:`.local_recovery.one_run` with ``replicas`` at ``rate`` for ``seconds``."""
    options = argparse.Namespace(**{**vars(args), "replicas": replicas, "rate": rate, "seconds": seconds, "standbys": 0})
    figures = one_run(name, "local", kill_at, options, root)
    figures["replicas"] = replicas
    return figures


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f} s"


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench replicas", description=__doc__.split("\n\n")[0])
    run_options(parser, 300, 8.0, 2, 4.0, "rounds")
    parser.add_argument("--backlog", type=int, default=200_000, help="elements of the throughput runs (default 200,000; 0: none)")
    args = parser.parse_args(argv)
    print(f"replicas bench: parallelism {args.parallelism}, {args.rate:g} elements/s for {args.seconds:g} s, exactly-once, "
          f"recovery='local', snapshots every {args.snapshot_interval:g} s, the primary of by_key/{VICTIM} killed at {args.kill_at:g} s; "
          f"throughput over a backlog of {args.backlog:,}", flush=True)
    runs = rounds(args)
    ok = report(runs, args.backlog)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "output"} for r in runs], indent=1))
        print(f"results: {args.json}")
    return 0 if ok else 1


def rounds(args: argparse.Namespace) -> list:
    """Every run: replicas=1 at the rate (the reference), then per round replicas=2 at the rate
    without and with the kill, and the backlog with replicas=1 and =2."""
    from driftstream.engine.runtime.ray_session import ensure_ray

    started_ray = ensure_ray(None)
    try:
        with tempfile.TemporaryDirectory(prefix="driftstream-replicas-bench-") as root:
            runs = [run("rpb-one", 1, None, args, root, args.rate, args.seconds)]
            for n in range(args.repeat):
                runs.append(run(f"rpb-none-{n}", 2, None, args, root, args.rate, args.seconds))
                runs.append(run(f"rpb-kill-{n}", 2, args.kill_at, args, root, args.rate, args.seconds))
                for r in (1, 2) if args.backlog else ():
                    runs.append(run(f"rpb-backlog{r}-{n}", r, None, args, root, BACKLOG_RATE, args.backlog / BACKLOG_RATE))
            return runs
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def report(runs: list, backlog: int) -> bool:
    """Print each run and the comparisons; False if an output differs or a kill did not happen."""
    base, ok = runs[0], True
    for r in runs:
        throughput = r["run"].startswith("rpb-backlog")
        same = throughput or r["output"] == base["output"]
        ok = ok and same and (r["killed"] or not r["run"].startswith("rpb-kill"))
        rate = f"   {backlog / r['span_s']:,.0f} elements/s" if throughput else ""
        print(f"{r['run']:<15} replicas={r['replicas']}   longest gap {_s(r['longest_gap_s']):>9}   first output {_s(r['first_output_s']):>9}   "
              f"restores {json.dumps(r['restores'])}   kind {','.join(r['kinds']) or '-'}   output {'equal' if same else 'DIFFERS'}{rate}")
    kills = [r["longest_gap_s"] for r in runs if r["run"].startswith("rpb-kill")]
    nones = [r["longest_gap_s"] for r in runs if r["run"].startswith("rpb-none")]
    if kills and nones:
        print(f"longest gap, killed / not: worst {max(kills):.3f} s / {max(nones):.3f} s (ratio {max(kills) / max(nones):.2f}); "
              f"restores: {sum(len(r['restores']) for r in runs)}")
    pairs = [(a, b) for a, b in zip(runs, runs[1:]) if a["run"].startswith("rpb-backlog1") and b["run"].startswith("rpb-backlog2")]
    if pairs:
        ratios = [a["span_s"] / b["span_s"] for a, b in pairs]
        print(f"throughput replicas=2 / replicas=1: median {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
