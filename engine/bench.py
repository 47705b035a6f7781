"""``driftstream bench``: figures for the engine's performance floors.

    driftstream bench wordcount                       # throughput + latency at 1,000 words/s
    driftstream bench wordcount --lines 40000 --rate 1000 --seconds 15

Throughput: word count (flat_map split -> key_by -> stateful count) over an
in-memory corpus, as fast as it goes; words/s = words / wall time of the run.
Latency: the same flow fed by a paced source at a steady words/s rate;
release latency = barrier release time - source emit time, per input line.
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

from driftstream.examples import wordcount

from .testing import MemorySource, PacedSource


def throughput(lines: int = 40_000, parallelism: int = 2, batch_size: int = 256, max_inflight: int = 1_000, **run: object) -> dict:
    """Run word count over ``lines`` lines of 10 words; returns words/s and run metrics."""
    text = wordcount.corpus(lines)
    flow = wordcount.build("bench-throughput", MemorySource(text, partitions=2))
    result = flow.run(parallelism=parallelism, batch_size=batch_size, max_inflight=max_inflight, **run)
    words = result.metrics.elements["count"]
    return {
        "words": words,
        "wall_s": result.metrics.wall_time,
        "words_per_s": words / result.metrics.wall_time,
        "tombstones": result.metrics.total_tombstones,
        "parallelism": parallelism,
    }


def latency(words_per_s: float = 1_000, seconds: float = 10.0, parallelism: int = 2, **run: object) -> dict:
    """Feed word count at a steady ``words_per_s`` (10-word lines) and return release-latency percentiles (ms)."""
    lines_per_s = words_per_s / 10
    text = wordcount.corpus(int(lines_per_s * seconds))
    flow = wordcount.build("bench-latency", PacedSource(text, rate=lines_per_s, partitions=1))
    result = flow.run(parallelism=parallelism, batch_size=64, **run)
    return dict(result.metrics.latency_ms, words_per_s=words_per_s, parallelism=parallelism)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    wc = sub.add_parser("wordcount", help="word count throughput and release latency")
    wc.add_argument("--lines", type=int, default=40_000, help="lines (10 words each) for the throughput run")
    wc.add_argument("--rate", type=float, default=1_000, help="words/s for the latency run")
    wc.add_argument("--seconds", type=float, default=10.0, help="length of the latency run")
    wc.add_argument("--parallelism", "-p", type=int, default=2)
    wc.add_argument("--address", default=None)
    wc.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from .ray_runtime import ensure_ray

    started = ensure_ray(args.address)
    try:
        tp = throughput(args.lines, args.parallelism)
        print(f"throughput: {tp['words_per_s']:,.0f} words/s ({tp['words']:,} words in {tp['wall_s']:.2f}s, "
              f"{tp['tombstones']:,} tombstones, parallelism {tp['parallelism']}; floor 50,000)")
        lat = latency(args.rate, args.seconds, args.parallelism)
        print(f"latency at {args.rate:,.0f} words/s: " + ", ".join(f"{k} {lat[k]:.2f} ms" for k in ("p50", "p75", "p95", "p99", "max"))
              + f" over {lat['count']} lines (floors: p50 <= 10 ms, p99 <= 30 ms)")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"throughput": tp, "latency": lat}, fh, indent=2)
    finally:
        if started:
            import ray

            ray.shutdown()
    return 0
