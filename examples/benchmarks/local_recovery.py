"""``driftstream bench local-recovery``: one stateful instance killed, recovered locally and
globally in one invocation, on the same flow.

    driftstream bench local-recovery                          # parallelism 4, 2,000 elements/s, 6 s, kill at 3 s
    driftstream bench local-recovery --repeat 3 --standbys 1 --json local.json

The flow is the exactly-once bench's (:func:`~driftstream.examples.benchmarks.bench.eo_flow`:
a scheduled source, ``key_by``, a rolling hash per key, a file sink whose partitions note the
wall time each bundle is durable), run exactly-once three ways: with no failure (``recovery="local"``,
nothing killed), then killing ``by_key/1`` ``--kill-at`` seconds into the input under
``recovery="local"`` and under ``recovery="global"``, each with its own standbys unless
``--standbys`` says (one under local, whose replacement starts while the others work; none
under global). Per run it prints:

- ``first output``: from the kill to the first bundle of the killed instance's sink partition
  written by its replacement (another process);
- ``others' longest gap``: the longest time between two bundles of any other partition, from
  the first second of output to the last (the failure-free run's is the floor);
- ``restores``: ``metrics.restores`` (which instances restored), and the recovery's ``kind``;
- whether the output equals the failure-free run's (index, hash and Meta of every element).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

#: the stateful instance killed: by_key/1 writes sink partition 1
VICTIM = 1


def flow_of(name: str, n: int, rate: float, partitions: int, workdir: str):
    """The exactly-once bench's flow (:func:`~driftstream.examples.benchmarks.bench.eo_flow`) whose
    sink partitions also note the writing process: the killed instance's last bundle may land
    after the kill, its replacement's first is another process's."""
    from driftstream.engine import Flow
    from driftstream.examples.benchmarks.bench import ScheduledSource, _key, rolling_hash

    os.makedirs(workdir, exist_ok=True)
    flow = Flow(name)
    (flow.source(ScheduledSource(n, rate, partitions, os.path.join(workdir, "epoch")), name="src")
         .key_by(_key, name="by_key")
         .stateful_map(rolling_hash, name="hash")
         .sink(_PidFileSink(os.path.join(workdir, "out"), name="out")))
    return flow


def _pid_sink_class():
    from driftstream.examples.benchmarks.bench import TimedFileSink, _TimedPartition

    class PidPartition(_TimedPartition):
        def write(self, bundle) -> None:
            self.inner.write(bundle)
            os.write(self.fd, (json.dumps([time.time(), os.getpid()]) + "\n").encode())

    class PidFileSink(TimedFileSink):
        """A file sink noting ``[wall time, pid]`` per durable bundle in ``<file>.released``."""

        def open(self, partition: int, partitions: int):
            inner = super(TimedFileSink, self).open(partition, partitions)
            return PidPartition(inner, self.partition_path(partition) + ".released")

    return PidFileSink


_PidFileSink = _pid_sink_class()


def released(workdir: str) -> dict:
    """Per sink partition, ``(wall time, pid)`` of each bundle once durable, in time order."""
    times: dict = {}
    for path in glob.glob(os.path.join(workdir, "out", "out-*.jsonl.released")):
        partition = int(os.path.basename(path).split("-")[1].split(".")[0])
        with open(path) as fh:
            times[partition] = sorted(tuple(json.loads(line)) for line in fh if line.strip())
    return times


def longest_gap(times: list, skip_s: float = 1.0) -> float:
    """The longest time between two consecutive releases, from ``skip_s`` after the first.

    >>> longest_gap([0.0, 0.5, 1.2, 1.3, 2.5, 2.6], skip_s=1.0)
    1.2
    """
    kept = [t for t in times if t >= times[0] + skip_s] if times else []
    return max((b - a for a, b in zip(kept, kept[1:])), default=0.0)


def first_new(releases: list, t: float) -> Optional[float]:
    """Seconds from ``t`` (the kill) to the first release, after it, by another process than
    the one releasing at ``t`` (None: none).

    >>> first_new([(1.0, 7), (2.0, 7), (2.6, 7), (3.5, 8)], 2.5)
    1.0
    """
    before = [pid for when, pid in releases if when <= t]
    dead = before[-1] if before else None
    later = [when for when, pid in releases if when > t and pid != dead]
    return later[0] - t if later else None


def output_of(workdir: str) -> list:
    """Every element's ``(Meta, index, hash)``, in Meta order (the wall times in payloads left out)."""
    from driftstream.engine.connectors.file_sink import read_file_sink

    return sorted((tuple(m), v[0], v[1]) for m, v in read_file_sink(os.path.join(workdir, "out"), "out"))


def one_run(name: str, recovery: str, kill_at: Optional[float], args: argparse.Namespace, root: str) -> dict:
    """Run the flow once (killing ``by_key/VICTIM`` at ``kill_at`` s of input, or not); its figures."""
    import ray

    from driftstream.engine.testing import wait_for_actor

    workdir = os.path.join(root, name)
    flow = flow_of(name, int(args.rate * args.seconds), args.rate, args.parallelism, workdir)
    killed: list = []
    stop = threading.Event()

    def killer() -> None:
        epoch_path = os.path.join(workdir, "epoch")
        while not os.path.exists(epoch_path) and not stop.is_set():
            time.sleep(0.01)
        if stop.is_set():
            return
        with open(epoch_path) as fh:
            epoch = float(fh.read())
        handle = wait_for_actor(f"{name}/by_key/{VICTIM}", stop=stop)
        time.sleep(max(0.0, epoch + kill_at - time.time()))
        if handle is not None and not stop.is_set():
            killed.append(time.time())
            ray.kill(handle, no_restart=True)

    thread = threading.Thread(target=killer, daemon=True)
    if kill_at is not None:
        thread.start()
    try:
        result = flow.run(parallelism=args.parallelism, guarantee="exactly-once", snapshot_interval=args.snapshot_interval,
                          snapshot_dir=os.path.join(workdir, "snapshots"), recovery=recovery, standbys=args.standbys,
                          replicas=getattr(args, "replicas", 1))
    finally:
        stop.set()
    times = released(workdir)
    others = [longest_gap([when for when, _ in ts]) for p, ts in times.items() if p != VICTIM]
    recoveries = result.metrics.recovery_s
    return {"run": name, "recovery": recovery, "killed": bool(killed), "killed_at": killed[0] if killed else None,
            "first_output_s": first_new(times.get(VICTIM, []), killed[0]) if killed else None,
            "others_longest_gap_s": max(others, default=0.0), "restores": dict(result.metrics.restores),
            "longest_gap_s": max((longest_gap([when for when, _ in ts]) for ts in times.values()), default=0.0),
            "span_s": max((ts[-1][0] for ts in times.values() if ts), default=0.0) - _epoch(workdir),
            "kinds": [r["kind"] for r in recoveries], "engine_first_output_s": [r["first_output_s"] for r in recoveries],
            "detected_at": [r["detected_at"] for r in recoveries],
            "restored_s": [r["restored_s"] for r in recoveries], "steps_s": [r["steps_s"] for r in recoveries],
            "resets_s": [r["resets_s"] for r in recoveries], "output": output_of(workdir)}


def _epoch(workdir: str) -> float:
    """The wall time the source's schedule began (its first read)."""
    with open(os.path.join(workdir, "epoch")) as fh:
        return float(fh.read())


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f} s"


def format_run(r: dict, same: bool) -> str:
    """One run's line of the table."""
    return (f"{r['run']:<14} {r['recovery']:<7} first output {_s(r['first_output_s']):>9}   others' longest gap {_s(r['others_longest_gap_s']):>9}   "
            f"restores {json.dumps(r['restores']) or '{}'}   kind {','.join(r['kinds']) or '-'}   output {'equal' if same else 'DIFFERS'}")


def run_options(parser: argparse.ArgumentParser, rate: float, seconds: float, parallelism: int, kill_at: float, repeat: str) -> None:
    """The options of a bench of :func:`one_run`: their defaults, and what ``--repeat`` repeats."""
    parser.add_argument("--rate", type=float, default=rate, help=f"elements/s (default {rate:,g})")
    parser.add_argument("--seconds", type=float, default=seconds, help=f"seconds of input per run (default {seconds:g})")
    parser.add_argument("--parallelism", "-p", type=int, default=parallelism, help=f"(default {parallelism}; also the source's partitions)")
    parser.add_argument("--kill-at", type=float, default=kill_at, help=f"seconds into the input the stateful instance is killed (default {kill_at:g})")
    parser.add_argument("--snapshot-interval", type=float, default=0.5, help="seconds (default 0.5)")
    parser.add_argument("--repeat", type=int, default=1, help=f"{repeat} (default 1)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench local-recovery", description=__doc__.split("\n\n")[0])
    run_options(parser, 2_000, 6.0, 4, 3.0, "local and global runs each")
    parser.add_argument("--standbys", type=int, default=None,
                        help="spare actors (default: each recovery's own, one under local, none under global; 0: a new process replaces the killed one)")
    args = parser.parse_args(argv)

    from driftstream.engine.runtime.ray_session import ensure_ray

    started_ray = ensure_ray(None)
    print(f"local-recovery bench: parallelism {args.parallelism}, {args.rate:g} elements/s for {args.seconds:g} s, exactly-once, "
          f"snapshots every {args.snapshot_interval:g} s, by_key/{VICTIM} killed at {args.kill_at:g} s, "
          f"{'each recovery its own standbys' if args.standbys is None else f'{args.standbys} standby(s)'}", flush=True)
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="driftstream-local-bench-") as root:
            base = one_run("lrb-none", "local", None, args, root)
            runs.append(base)
            for n in range(args.repeat):
                for recovery in ("local", "global"):
                    runs.append(one_run(f"lrb-{recovery}-{n}", recovery, args.kill_at, args, root))
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    expected = base["output"]
    ok = True
    for r in runs:
        same = r["output"] == expected
        ok = ok and same and (r["killed"] or r is base)
        print(format_run(r, same))
    for recovery in ("local", "global"):
        mine = [r for r in runs if r["recovery"] == recovery and r["killed"]]
        firsts = [r["first_output_s"] for r in mine if r["first_output_s"] is not None]
        if firsts:
            print(f"{recovery}: first output after the kill, best {min(firsts):.3f} s, mean {sum(firsts) / len(firsts):.3f} s; "
                  f"others' longest gap, worst {max(r['others_longest_gap_s'] for r in mine):.3f} s "
                  f"(failure-free {base['others_longest_gap_s']:.3f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "output"} for r in runs], indent=1))
        print(f"results: {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
