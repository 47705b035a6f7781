"""``driftstream bench replicas``: replicas on Ray (``replicas=2``, ``verify="first"``), a
stateful instance's primary killed, in one invocation; with ``--verify majority`` the votes' cost,
with ``--verify sample:N`` the sampled votes' against majority's and ``"first"``'s.

    driftstream bench replicas                        # parallelism 2, 300 elements/s for 8 s, kill at 4 s
    driftstream bench replicas --repeat 3 --json replicas.json
    driftstream bench replicas --verify majority --replicas 3 --repeat 3
    driftstream bench replicas --verify sample:4 --replicas 3 --repeat 3

The flow is the local-recovery bench's (:func:`~driftstream.examples.benchmarks.local_recovery.
flow_of`: a scheduled source, ``key_by``, a rolling hash per key, a file sink noting when and by
which process each bundle is durable), exactly-once under ``recovery="local"``. Per round:

- at ``--rate``: replicas=2 with no failure, then with the primary of ``by_key/1`` killed
  ``--kill-at`` seconds in: the longest gap between two bundles of any partition (the killed
  one's included, from 1 s after the first), the killed partition's first output by another
  process, ``metrics.restores`` and the recovery's kind; the output checked against replicas=1's;
  the replacement replica (a new process; a standby with ``--standbys 1``) restored and caught up meanwhile: seconds
  from the kill until it joined, and how they went (its process start, restore, connect, replay);
- a backlog of ``--backlog`` elements (all available at once) with replicas=1 and =2: elements/s
  from the schedule's start to the last bundle durable, and their ratio.

With ``--verify majority`` (no kill: the votes' cost), per round, interleaved: the exactly-once
bench's flow (:func:`~driftstream.examples.benchmarks.bench.eo_flow`) at ``--rate`` with
replicas=1 and with ``--replicas`` under ``verify="majority"``, release latency (durable minus
emitted, the first second left out) p50 and p99; then the backlog with each, elements/s, the CPU
seconds of the Ray session's processes and the ratios. Every output is checked exactly-once.
With ``--verify sample:N`` the same, each round ``verify="first"``, ``"majority"`` and
``"sample:N"``, all at ``--replicas``, the ratios against ``"first"``'s; each line with the load
(the 1-minute load average) at its run's end.
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
    options = argparse.Namespace(**{**vars(args), "replicas": replicas, "rate": rate, "seconds": seconds})
    figures = one_run(name, "local", kill_at, options, root)
    figures["replicas"] = replicas
    return figures


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f} s"


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench replicas", description=__doc__.split("\n\n")[0])
    run_options(parser, 300, 8.0, 2, 4.0, "rounds")
    parser.add_argument("--backlog", type=int, default=200_000, help="elements of the throughput runs (default 200,000; 0: none)")
    parser.add_argument("--verify", type=_verify, default="first",
                        help="first (default): the kill runs; majority: the votes' latency and throughput against replicas=1; "
                             "sample:N: first, majority and sample:N against each other")
    parser.add_argument("--standbys", type=int, default=0, help="spare actors (default 0: a lost replica's replacement is a new process)")
    parser.add_argument("--replicas", type=int, default=2,
                        help="--verify majority: replicas of each keyed instance (default 2; 3 outvote one); the kill runs take 2")
    args = parser.parse_args(argv)
    if args.verify != "first":
        return votes_main(args)
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


def joined_s(r: dict) -> Optional[float]:
    """Seconds from run ``r``'s kill until its replacement replica joined (None: none joined)."""
    for kind, detected, joined in zip(r["kinds"], r["detected_at"], r["engine_first_output_s"]):
        if kind == "replica replaced" and joined is not None and r["killed_at"] is not None:
            return detected + joined - r["killed_at"]
    return None


def replacement(r: dict) -> str:
    """Run ``r``'s replacement replica: when it joined after the kill, and where its setup went."""
    joined = joined_s(r) if r.get("killed_at") is not None else None
    if joined is None:
        return ""
    steps = r["steps_s"][r["kinds"].index("replica replaced")]
    return f"\n{'':<15} replacement joined {joined:.3f} s after the kill ({', '.join(f'{k} {v:.3f} s' for k, v in steps.items())})"


def report(runs: list, backlog: int) -> bool:
    """Print each run and the comparisons; False if an output differs or a kill did not happen."""
    base, ok = runs[0], True
    for r in runs:
        throughput = r["run"].startswith("rpb-backlog")
        same = throughput or r["output"] == base["output"]
        ok = ok and same and (r["killed"] or not r["run"].startswith("rpb-kill"))
        rate = f"   {backlog / r['span_s']:,.0f} elements/s" if throughput else ""
        print(f"{r['run']:<15} replicas={r['replicas']}   longest gap {_s(r['longest_gap_s']):>9}   first output {_s(r['first_output_s']):>9}   "
              f"restores {json.dumps(r['restores'])}   kind {','.join(r['kinds']) or '-'}   output {'equal' if same else 'DIFFERS'}{rate}"
              f"{replacement(r)}")
    kills = [r["longest_gap_s"] for r in runs if r["run"].startswith("rpb-kill")]
    nones = [r["longest_gap_s"] for r in runs if r["run"].startswith("rpb-none")]
    if kills and nones:
        print(f"longest gap, killed / not: worst {max(kills):.3f} s / {max(nones):.3f} s (ratio {max(kills) / max(nones):.2f}); "
              f"restores: {sum(len(r['restores']) for r in runs)}")
        joins = [joined_s(r) for r in runs if r["run"].startswith("rpb-kill")]
        print(f"replacement replica joined after the kill: {', '.join('-' if j is None else f'{j:.3f} s' for j in joins)}")
    pairs = [(a, b) for a, b in zip(runs, runs[1:]) if a["run"].startswith("rpb-backlog1") and b["run"].startswith("rpb-backlog2")]
    if pairs:
        ratios = [a["span_s"] / b["span_s"] for a, b in pairs]
        print(f"throughput replicas=2 / replicas=1: median {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    return ok



#: seconds of release latency left out at the start of a paced run (actors warming up)
WARMUP_S = 1.0


def _verify(text: str) -> str:
    """``--verify``: first, majority or sample:N."""
    from driftstream.engine.model.config import vote_sample

    if text in ("first", "majority") or vote_sample(text) is not None:
        return text
    raise argparse.ArgumentTypeError(f"first, majority or sample:N, not {text!r}")


def _modes(args: argparse.Namespace) -> list:
    """``(replicas, verify)`` of each run of a round: the first is the basis of the ratios."""
    if args.verify == "majority":
        return [(1, None), (args.replicas, "majority")]
    return [(args.replicas, "first"), (args.replicas, "majority"), (args.replicas, args.verify)]


def votes_main(args: argparse.Namespace) -> int:
    """``--verify majority``: per round replicas=1 and ``--replicas`` voting, paced then over the backlog;
    ``--verify sample:N``: first, majority and sample:N at ``--replicas``."""
    modes = _modes(args)
    print(f"replicas bench, verify={args.verify!r}: parallelism {args.parallelism}, "
          f"{', '.join(f'replicas={r} {v or chr(45)}' for r, v in modes)}, {args.rate:g} elements/s "
          f"for {args.seconds:g} s, exactly-once, recovery='local', snapshots (epochs) every {args.snapshot_interval:g} s; throughput over "
          f"a backlog of {args.backlog:,}; {args.repeat} round(s), interleaved", flush=True)
    from driftstream.engine.runtime.ray_session import ensure_ray

    started_ray = ensure_ray(None)
    try:
        with tempfile.TemporaryDirectory(prefix="driftstream-votes-bench-") as root:
            runs = [vote_run(f"rvb-{kind}{m}-{n}", r, verify, args, root, rate, seconds)
                    for n in range(args.repeat)
                    for kind, rate, seconds in (("paced", args.rate, args.seconds), ("backlog", BACKLOG_RATE, args.backlog / BACKLOG_RATE))
                    if seconds > 0 for m, (r, verify) in enumerate(modes)]
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    ok = report_votes(runs, len(modes))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(runs, indent=1))
        print(f"results: {args.json}")
    return 0 if ok else 1


def vote_run(name: str, replicas: int, verify: Optional[str], args: argparse.Namespace, root: str, rate: float, seconds: float) -> dict:
    """One run of the exactly-once bench's flow: replicas=1, or ``replicas`` under ``verify``; its figures."""
    import os

    from driftstream.examples.benchmarks.bench import _ms, _run_eo
    from driftstream.examples.inverted_index.files_basis import TreeCpu

    n = int(rate * seconds)
    voting = {} if replicas == 1 else {"replicas": replicas, "verify": verify}
    cpu = TreeCpu(every=1.0)  # the Ray session's processes, when this process started it (else ~0)
    try:
        run = _run_eo(name, "exactly-once", args.snapshot_interval, n, rate, args.parallelism, args.parallelism, root, recovery="local",
                      **voting)
    finally:
        cpu_s = cpu.stop()
    epoch, rows = run["epoch"], run["rows"]
    latencies = [release - emit for _, emit, release, _ in rows if release is not None and emit >= epoch + WARMUP_S]
    span = max((release for _, _, release, _ in rows if release is not None), default=epoch) - epoch
    return {"run": name, "replicas": replicas, "verify": verify, "load": os.getloadavg()[0], "elements": n, "latency_ms": _ms(latencies), "span_s": span, "cpu_s": cpu_s,
            "exactly_once": run["check"]["exactly_once"], "dissents": run["metrics"].dissents,
            "kinds": [r["kind"] for r in run["metrics"].recovery_s]}


def report_votes(runs: list, modes: int) -> bool:
    """Each run's line and, against each round's first mode, the others' added latency and
    throughput and CPU ratios; False if an output is not exactly-once."""
    for r in runs:
        lat = r["latency_ms"]
        figure = (f"p50 {lat.get('p50', 0):7.1f} ms   p99 {lat.get('p99', 0):7.1f} ms" if r["run"].startswith("rvb-paced")
                  else f"{r['elements'] / r['span_s']:,.0f} elements/s")
        print(f"{r['run']:<18} replicas={r['replicas']} {r['verify'] or '-':<9} {figure}   cpu {r['cpu_s']:6.1f} s   load {r['load']:5.1f}   "
              f"exactly-once {r['exactly_once']}   dissents {len(r['dissents'])}   recoveries {','.join(r['kinds']) or '-'}")
    for kind in ("paced", "backlog"):
        rounds = [group for group in (runs[i:i + modes] for i in range(0, len(runs), modes)) if group[0]["run"].startswith(f"rvb-{kind}")]
        for m in range(1, modes):
            pairs = [(g[0], g[m]) for g in rounds if len(g) > m]
            if not pairs:
                continue
            what = f"{pairs[0][1]['verify']} (r={pairs[0][1]['replicas']}) against {pairs[0][0]['verify'] or 'replicas=1'}"
            if kind == "paced":
                p50 = [b["latency_ms"].get("p50", 0) - a["latency_ms"].get("p50", 0) for a, b in pairs]
                p99 = [b["latency_ms"].get("p99", 0) - a["latency_ms"].get("p99", 0) for a, b in pairs]
                print(f"added latency, {what}, per round: p50 {', '.join(f'{x:+.1f}' for x in p50)} ms; p99 {', '.join(f'{y:+.1f}' for y in p99)} ms")
            else:
                ratios = [a["span_s"] / b["span_s"] for a, b in pairs]
                cpus = [b["cpu_s"] / a["cpu_s"] if a["cpu_s"] else 0.0 for a, b in pairs]
                print(f"throughput, {what}: median {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)}); "
                      f"CPU seconds (the session's, starts included): median {statistics.median(cpus):.2f} ({', '.join(f'{x:.2f}' for x in cpus)})")
    return all(r["exactly_once"] for r in runs)


if __name__ == "__main__":
    raise SystemExit(main())
