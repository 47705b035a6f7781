"""``driftstream bench``: figures for the engine's performance floors.

    driftstream bench wordcount                       # throughput + latency at 1,000 words/s
    driftstream bench wordcount --lines 40000 --rate 1000 --seconds 15
    driftstream bench exactly-once                    # latency under snapshots, recovery times
    driftstream bench exactly-once --rate 2000 --seconds 10 --json eo.json
    driftstream bench rescale [--cluster]            # downtime of a running flow's rescale 2 -> 3 -> 2 (rescale.py)
    driftstream bench local-recovery                  # one instance killed: recovery="local" against "global" (local_recovery.py)
    driftstream bench replicas                        # replicas=2, a primary killed: output gap, throughput against replicas=1 (replicas.py)
    RAY_enable_metrics_collection=1 driftstream bench exactly-once --rate 50 --seconds 20 --intervals 1.0 --metrics-ab 4
                                                      # the metrics export's cost: off / on, in turn

Throughput: word count (flat_map split -> key_by -> stateful count) over an
in-memory corpus, as fast as it goes; words/s = words / wall time of the run.
Latency: the same flow fed by a paced source at a steady words/s rate;
release latency = barrier release time - source emit time, per input line.

Exactly-once (:func:`exactly_once`): a keyed, order-sensitive pipeline (key_by ->
stateful_map keeping a rolling hash per key -> FileSink) fed at a steady rate, run
with guarantee "none" and "exactly-once" at several snapshot intervals in one Ray
session, then once more with a stateful actor killed twice. Per-element emit and
release times come from the pipeline itself, not from the engine's percentiles:
the source puts its wall time into each payload when it emits, and the sink
partition notes the wall time after each bundle is durable. That lets the bench
skip the warm-up, split latency by "released during a snapshot or not", and follow
latency over time around a failure. The input is scheduled on the wall clock
(element i is available at epoch + i / rate, one epoch for the whole run, also
after a replay), so after a failure the restored run finds a backlog, as it would
in Kafka, and "end-to-end" latency (available -> released) shows the outage.
Everything runs on one machine (the source shares its epoch through a file).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob
import importlib
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Optional

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.file_sink import FileSink, read_partition_file
from driftstream.engine.model.connectors import SinkPartition
from driftstream.examples import wordcount

from driftstream.engine.cli.status_view import recovery_resets, recovery_steps
from driftstream.engine.api.flow import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.result import percentiles
from driftstream.engine.connectors.memory import ListPartition, MemorySource, PacedSource
from driftstream.engine.testing import wait_for_actor


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


# -- exactly-once: latency under snapshots, recovery ----------------------------------------

#: Keys of the exactly-once pipeline; element i has key i % EO_KEYS.
EO_KEYS = 64
_PRIME = 1_000_003
_LAT_FIELDS = ("p50", "p75", "p95", "p99", "max")


def rolling_hash(state, x):
    """Order-sensitive keyed state: a rolling hash of the key's history of indexes.

    ``x`` is ``(index, emit wall time, wall time the source partition was opened)``; the
    hash depends on the index only, so a replay (which emits at another time) must
    reproduce it exactly. The output carries the times through to the sink.
    """
    new = ((state or 0) * 31 + x[0]) % _PRIME
    return new, [x[0], new, x[1], x[2]]


def _key(x) -> int:
    return x[0] % EO_KEYS


def expected_hashes(n: int) -> list:
    """The rolling hash each element must carry in the output (per key, in index order)."""
    state = [0] * EO_KEYS
    out = []
    for i in range(n):
        k = i % EO_KEYS
        state[k] = (state[k] * 31 + i) % _PRIME
        out.append(state[k])
    return out


def _shared_epoch(path: str) -> float:
    """The wall time of the first read of any partition of the run (created once, atomically)."""
    try:
        with open(path) as fh:
            return float(fh.read())
    except FileNotFoundError:
        pass
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as fh:
        fh.write(repr(time.time()))
    try:
        os.link(tmp, path)  # fails if another partition was first: then use its epoch
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path) as fh:
        return float(fh.read())


class _ScheduledPartition(ListPartition):
    def __init__(self, items, partition: int, partitions: int, source_id: int, rate: float, clock_path: str, start=None) -> None:
        super().__init__(items, partition, partitions, source_id, start)
        self.rate, self.clock_path = rate, clock_path
        self.epoch: Optional[float] = None
        self.opened_at = time.time()  # after a failure: when the restored run reopened it

    def _due(self) -> int:
        if self.epoch is None:
            self.epoch = _shared_epoch(self.clock_path)
        return min(len(self.items), int((time.time() - self.epoch) * self.rate) + 1)

    def next_ready_in(self) -> Optional[float]:
        if self.epoch is None or self.done:
            return None
        return max(0.0, self.epoch + self.pos / self.rate - time.time())

    def read(self, max_items: int) -> list:
        out = super().read(max_items)
        if not out:
            return out
        now, opened = time.time(), self.opened_at
        return [(m, (p, now, opened)) for m, p in out]


class ScheduledSource(MemorySource):
    """Elements ``0..n-1``; element ``i`` becomes available at ``epoch + i / rate``.

    Unlike :class:`~driftstream.engine.testing.PacedSource`, whose pacing restarts
    where a replay starts, the schedule is one for the whole run (the epoch is the
    first read by any partition, kept in ``clock_path``): a replay finds what became
    available meanwhile as a backlog and reads it as fast as credit allows. Each
    payload is ``(i, wall time of emission, wall time the partition was opened)``; times
    are the indexes, as in MemorySource.
    """

    def __init__(self, n: int, rate: float, partitions: int, clock_path: str) -> None:
        super().__init__((), partitions)
        if rate <= 0:
            raise ValueError("ScheduledSource needs rate > 0 (elements per second)")
        self.items = range(n)
        self.rate, self.clock_path = rate, clock_path

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None):
        return _ScheduledPartition(self.items, partition, self._partitions, source_id, self.rate, self.clock_path, start)


class _TimedPartition(SinkPartition):
    """A FileSink partition that also appends ``[wall time, [ts, ...]]`` to a side file once a bundle is durable."""

    def __init__(self, inner: SinkPartition, side_path: str) -> None:
        self.inner = inner
        self.fd: Optional[int] = os.open(side_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, bundle: Bundle) -> None:
        self.inner.write(bundle)
        now = time.time()
        os.write(self.fd, (json.dumps([now, [m[0] for m, _ in bundle.elements]]) + "\n").encode())

    def t_last(self):
        return self.inner.t_last()

    def close(self) -> None:
        self.inner.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TimedFileSink(FileSink):
    """:class:`FileSink` plus, per partition, release wall times in ``<file>.released``."""

    def open(self, partition: int, partitions: int) -> SinkPartition:
        inner = super().open(partition, partitions)
        return _TimedPartition(inner, self.partition_path(partition) + ".released")


def eo_flow(name: str, n: int, rate: float, partitions: int, workdir: str) -> Flow:
    """``src -> key_by -> stateful_map(rolling_hash) -> TimedFileSink`` under ``workdir``.

    The stateful stage is ``by_key``: its actors are ``<name>/by_key/<i>``.
    """
    os.makedirs(workdir, exist_ok=True)
    flow = Flow(name)
    source = ScheduledSource(n, rate, partitions, os.path.join(workdir, "epoch"))
    (flow.source(source, name="src")
         .key_by(_key, name="by_key")
         .stateful_map(rolling_hash, name="hash")
         .sink(TimedFileSink(os.path.join(workdir, "out"), name="out")))
    return flow


def _killer(actor_name: str, workdir: str, at: tuple, log: list, stop: threading.Event, settle: float = 1.0,
            phases: tuple = ()) -> threading.Thread:
    """Kill ``actor_name`` (instance 0 of the stateful stage) ``at[k]`` seconds after the run's
    epoch (its first read). Each kill also waits until the previous one has been recovered
    from, and ``settle`` seconds more: the replacement actor exists and its sink partition
    (``out-0``) has released output since. A late kill is logged with its actual time.

    ``phases`` (seconds, used in turn): kill ``k`` waits for the next snapshot committed
    after its time, then ``phases[k % len(phases)]`` more, so that the recovery replays that
    much input (plus the snapshot's own duration): how much a rollback costs beyond what
    recovering the lost instance alone would.
    """
    import ray

    from driftstream.snapshots.store import SnapshotStore

    store = SnapshotStore(os.path.join(workdir, "snapshots")) if phases else None

    def newest_commit() -> Optional[int]:
        ids = store.committed_ids()
        return ids[-1] if ids else None

    clock_path = os.path.join(workdir, "epoch")
    side_file = os.path.join(workdir, "out", "out-0.jsonl.released")

    def lookup(not_id=None):
        return wait_for_actor(actor_name, not_id, stop)

    def released_since(t: float) -> bool:
        try:
            return os.stat(side_file).st_mtime > t
        except FileNotFoundError:
            return False

    def run():
        while not os.path.exists(clock_path):
            if stop.wait(0.01):
                return
        epoch = _shared_epoch(clock_path)
        killed = None
        for offset in at:
            handle = lookup(killed)
            if handle is None:
                return
            due = epoch + offset
            if killed is not None:
                found = time.time()  # the supervisor freed the name, so the victim is gone
                while not released_since(found):
                    if stop.wait(0.01):
                        return
                due = max(due, time.time() + settle)
            if stop.wait(max(0.0, due - time.time())):
                return
            entry: dict = {"planned_s": offset}
            if phases:
                before = newest_commit()
                while (committed := newest_commit()) == before:
                    if stop.wait(0.002):
                        return
                seen = time.time()
                phase = phases[len(log) % len(phases)]
                if stop.wait(phase):
                    return
                manifest = store.read_manifest(committed)
                entry.update(phase_s=phase, snapshot=committed, commit_seen_at=seen,
                             snapshot_ts=None if manifest is None else manifest["t"][0])
            kill_at = time.time()
            ray.kill(handle, no_restart=True)
            log.append(dict(entry, kill_at=kill_at, at_s=kill_at - epoch))
            killed = handle._actor_id

    thread = threading.Thread(target=run, daemon=True, name="eo-bench-killer")
    thread.start()
    return thread


def _read_run(workdir: str, n: int) -> tuple:
    """``(rows, check)``: per released element ``(index, emit, release, source opened)`` (release
    None if its side record was lost to a kill), and the exactly-once check of the sink's content."""
    out_dir = os.path.join(workdir, "out")
    released: dict = {}
    for path in glob.glob(os.path.join(out_dir, "*.released")):
        with open(path, "rb") as fh:
            for line in fh.read().split(b"\n"):
                try:
                    when, idx = json.loads(line)
                except ValueError:
                    continue  # empty, or cut by a kill
                for i in idx:
                    released.setdefault(i, when)
    expected = expected_hashes(n)
    records: list = []
    in_order = True
    for path in sorted(glob.glob(os.path.join(out_dir, "out-*.jsonl"))):
        part = read_partition_file(path)
        in_order = in_order and all(part[k][0] < part[k + 1][0] for k in range(len(part) - 1))
        records.extend(part)
    records.sort(key=lambda rec: rec[0])
    seen: set = set()
    rows = []
    duplicates = wrong = 0
    for meta, value in records:
        i, h, emit, opened = value
        if i in seen:
            duplicates += 1
            continue
        seen.add(i)
        if not (0 <= i < n) or h != expected[i] or meta.ts != i:
            wrong += 1
        rows.append((i, emit, released.get(i), opened))
    check = {
        "elements": n,
        "lines": len(records),
        "duplicates": duplicates,
        "missing": n - len(seen),
        "wrong_hash": wrong,
        "in_order": in_order,  # each sink partition's file in strictly increasing t
        "no_release_time": sum(1 for r in rows if r[2] is None),
    }
    check["exactly_once"] = check["lines"] == n and not (duplicates or check["missing"] or wrong) and check["in_order"]
    return rows, check


def _ms(values: list) -> dict:
    return percentiles([v * 1000.0 for v in values])


def _stats_s(values: list) -> dict:
    """count, median, p95, max of durations in seconds (nearest-rank p95)."""
    if not values:
        return {"count": 0}
    p = percentiles(list(values), (95,))
    return {"count": len(values), "median": statistics.median(values), "p95": p["p95"], "max": p["max"]}


def _run_eo(name: str, guarantee: str, interval: Optional[float], n: int, rate: float, partitions: int,
            parallelism: int, root: str, kill_at: tuple = (), settle: float = 1.0, kill_phases: tuple = (),
            rss_every: Optional[float] = None, **run: object) -> dict:
    """One run; returns its per-element rows, check, metrics and snapshot/kill timings, and
    with ``rss_every`` the RSS of every actor that often (``[seconds into the run, {actor: MiB}]``)."""
    workdir = os.path.join(root, name)
    flow = eo_flow(name, n, rate, partitions, workdir)
    opts: dict = dict(parallelism=parallelism, guarantee=guarantee, timeout=n / rate + 120, **run)
    if guarantee != "none":
        opts.update(snapshot_interval=interval, snapshot_dir=os.path.join(workdir, "snapshots"))
    kills: list = []
    stop = threading.Event()
    killer = _killer(f"{name}/by_key/0", workdir, kill_at, kills, stop, settle, kill_phases) if kill_at else None
    rss: list = []
    sampler = _rss_sampler(rss_every, rss, stop) if rss_every else None
    try:
        result = flow.run(**opts)
    finally:
        stop.set()
        for thread in (killer, sampler):
            if thread is not None:
                thread.join(timeout=5)
    rows, check = _read_run(workdir, n)
    return {
        "rows": rows,
        "check": check,
        "metrics": result.metrics,
        "epoch": _shared_epoch(os.path.join(workdir, "epoch")),
        "windows": result.metrics.snapshot_windows,
        "kills": kills,
        "rss_mb": rss,
    }


def _rss_sampler(every: float, samples: list, stop: threading.Event) -> threading.Thread:
    """Append ``[seconds since start, {actor: RSS MiB}]`` to ``samples`` every ``every`` s until ``stop``."""
    from driftstream.examples.benchmarks.soak import actor_rss_mb

    def run() -> None:
        began = time.time()
        while not stop.wait(every):
            samples.append([round(time.time() - began, 1), actor_rss_mb()])

    thread = threading.Thread(target=run, daemon=True, name="eo-bench-rss")
    thread.start()
    return thread


def _steady_figures(label: str, guarantee: str, interval: Optional[float], run: dict, rate: float, warmup: float,
                    span: Optional[float] = None) -> dict:
    """Latency (warm-up skipped), snapshot durations, and latency during / outside snapshots;
    with ``span`` (seconds), also the latency of the first and the last ``span`` seconds of
    input after the warm-up (a long run: does latency drift?)."""
    m = run["metrics"]
    first = int(warmup * rate)
    kept = [(i, e, r) for i, e, r, _ in run["rows"] if i >= first and r is not None]
    epoch = run["epoch"]
    fig: dict = {
        "config": label,
        "guarantee": guarantee,
        "snapshot_interval": interval,
        "latency_ms": _ms([r - e for _, e, r in kept]),
        "end_to_end_ms": _ms([r - (epoch + i / rate) for i, _, r in kept]),
        "engine_latency_ms": dict(m.latency_ms),
        "wall_s": m.wall_time,
        "snapshots": m.snapshots,
        "snapshot_s": _stats_s(m.snapshot_s),
        "check": run["check"],
    }
    windows = run["windows"]
    if guarantee != "none" and windows is not None:
        starts = [w[0] for w in windows]
        during, outside = [], []
        for _, e, r in kept:
            k = bisect.bisect_right(starts, r) - 1
            (during if k >= 0 and r <= windows[k][1] else outside).append(r - e)
        fig["during_snapshot_ms"] = _ms(during)
        fig["outside_snapshot_ms"] = _ms(outside)
        fig["snapshot_windows"] = len(windows)
    if span:
        last = max((i for i, _, _ in kept), default=first)
        fig["spans"] = {
            "span_s": span,
            "first_ms": _ms([r - e for i, e, r in kept if i < first + span * rate]),
            "last_ms": _ms([r - e for i, e, r in kept if i > last - span * rate]),
            "first_end_to_end_ms": _ms([r - (epoch + i / rate) for i, _, r in kept if i < first + span * rate]),
            "last_end_to_end_ms": _ms([r - (epoch + i / rate) for i, _, r in kept if i > last - span * rate]),
            "rss_mb": run.get("rss_mb") or [],
        }
    return fig


@dataclass(frozen=True)
class Workload:
    """The exactly-once benches' input, shared by every run of an invocation: ``rate``
    elements/s for ``seconds`` over ``partitions`` source partitions, ``parallelism``
    instances per stage; the first ``warmup`` seconds of input left out of latency
    figures; files under ``workdir`` (None: a temporary directory)."""

    rate: float = 2_000
    seconds: float = 10.0
    partitions: int = 3
    parallelism: int = 2
    warmup: float = 1.0
    workdir: Optional[str] = None

    @property
    def elements(self) -> int:
        return int(self.rate * self.seconds)


def latency_under_snapshots(
    workload: Workload = Workload(), intervals: tuple = (0.05, 0.5, 1.0), prefix: str = "eob", with_none: bool = True,
    span: Optional[float] = None, **run: object
) -> dict:
    """Release latency for guarantee "none" and for "exactly-once" at each snapshot interval.

    Same pipeline, rate and Ray session for every configuration, one after another.
    Returns ``{"runs": [figures per configuration], "floors": {...}}``; latencies in ms
    over the elements after the first ``warmup`` seconds of input. ``with_none=False``:
    exactly-once only; ``span``: see :func:`_steady_figures`.
    """
    w = workload
    configs = [("none", "none", None)] * with_none + [(f"exactly-once {iv:g}s", "exactly-once", iv) for iv in intervals]
    runs = []
    with _workdir(w.workdir) as root:
        for k, (label, guarantee, interval) in enumerate(configs):
            name = f"{prefix}-{k}-{'none' if interval is None else 'eo%gs' % interval}"
            r = _run_eo(name, guarantee, interval, w.elements, w.rate, w.partitions, w.parallelism, root,
                        rss_every=span / 5 if span else None, **run)
            runs.append(_steady_figures(label, guarantee, interval, r, w.rate, w.warmup, span))
    return {"runs": runs, "floors": _floors(runs)}


def metrics_export_cost(workload: Workload = Workload(), interval: float = 1.0, rounds: int = 3, metrics_interval: Optional[float] = None,
                        prefix: str = "eom") -> dict:
    """Exactly-once release latency with the Ray metrics export off, then on, ``rounds``
    times in turn (A/B/A/B..., one Ray session: whatever drifts on a shared machine drifts
    for both). Ray must collect metrics (``RAY_enable_metrics_collection=1``) for "on" to
    export anything. Returns the runs' figures and the medians of each side's p50 / p99."""
    w, runs = workload, []
    extra = {} if metrics_interval is None else {"metrics_interval": metrics_interval}
    with _workdir(w.workdir) as root:
        for k in range(rounds):
            for export in (False, True):
                label = f"export {'on' if export else 'off'} #{k + 1}"
                r = _run_eo(f"{prefix}-{k}-{'on' if export else 'off'}", "exactly-once", interval, w.elements, w.rate, w.partitions,
                            w.parallelism, root, export_metrics=export, **extra)
                runs.append(dict(_steady_figures(label, "exactly-once", interval, r, w.rate, w.warmup), export_metrics=export))
    side = {on: [r["latency_ms"] for r in runs if r["export_metrics"] is on and r["latency_ms"].get("count")] for on in (False, True)}
    medians = {("on" if on else "off"): {q: statistics.median(x[q] for x in lat) for q in ("p50", "p99")} for on, lat in side.items() if lat}
    return {"runs": runs, "medians": medians}


def format_metrics_cost(cost: dict, rate: float, metrics_interval: float, collecting: bool) -> str:
    """Each run's p50 / p99, then the medians of each side and on minus off."""
    lines = [f"metrics export cost: exactly-once at {rate:,.0f} elements/s, export every {metrics_interval:g} s; Ray metrics collection "
             + ("on" if collecting else "OFF (RAY_enable_metrics_collection=0): 'on' runs export nothing")]
    for r in cost["runs"]:
        lat = r["latency_ms"]
        lines.append(f"  {r['config']:<16} p50 {_f(lat.get('p50'))} ms  p99 {_f(lat.get('p99'))} ms  ({lat.get('count', 0)} elements)")
    m = cost["medians"]
    if "on" in m and "off" in m:
        lines.append("  median over rounds: " + ", ".join(
            f"{q} off {m['off'][q]:.2f} on {m['on'][q]:.2f} (on - off {m['on'][q] - m['off'][q]:+.2f} ms)" for q in ("p50", "p99")))
    return "\n".join(lines)


def _floors(runs: list) -> dict:
    """The issue's floors: exactly-once p50 at most 5 ms above none's; p99 across intervals within 20% (max/min <= 1.2)."""
    none = next((r for r in runs if r["guarantee"] == "none"), None)
    eo = [r for r in runs if r["guarantee"] == "exactly-once" and r["latency_ms"].get("count")]
    floors: dict = {}
    if none is not None and none["latency_ms"].get("count") and eo:
        diffs = {f"{r['snapshot_interval']:g}": r["latency_ms"]["p50"] - none["latency_ms"]["p50"] for r in eo}
        floors["p50_minus_none_ms"] = diffs
        floors["p50_within_5ms"] = all(d <= 5.0 for d in diffs.values())  # at most 5 ms above none
    if len(eo) > 1:
        p99 = [r["latency_ms"]["p99"] for r in eo]
        floors["p99_max_over_min"] = max(p99) / min(p99)
        floors["p99_within_20pct"] = floors["p99_max_over_min"] <= 1.2
    return floors


def _windows_after(points: list, start: float, end: float, width: float) -> list:
    """``(window start, count, p50, p95, p99, max)`` over ``points`` ``(release, latency_ms)``
    sorted by release, in windows of ``width`` s from ``start`` up to ``end`` (empty ones left out)."""
    out = []
    k = bisect.bisect_left(points, (start, float("-inf")))
    lo = start
    while lo < end and k < len(points):
        hi = lo + width
        chunk = []
        while k < len(points) and points[k][0] < min(hi, end):
            chunk.append(points[k][1])
            k += 1
        if chunk:
            p = percentiles(chunk)
            out.append((lo, p["count"], p["p50"], p["p95"], p["p99"], p["max"]))
        lo = hi
    return out


def recovery(
    workload: Workload = Workload(),
    snapshot_interval: float = 1.0,
    kill_at: tuple = (3.0, 6.0),
    window: float = 0.25,
    settle: float = 1.0,
    name: str = "eob-recovery",
    kill_phases: tuple = (),
    **run: object,
) -> dict:
    """One exactly-once run with ``<name>/by_key/0`` killed ``kill_at`` seconds into the input.

    Per failure: kill -> detected, -> restored, -> first new output (engine metrics and
    per-element data), and kill -> latency back under the pre-failure p99: the end of the
    first ``window``-second window of releases after the recovery (windows counted from
    its first new output) whose p95 is at or below it, i.e. at most 5% of that window's
    elements above the old p99. Each kill waits for the previous recovery's first output
    plus ``settle`` seconds; with ``kill_phases``, also for a snapshot's commit and a phase
    after it (see :func:`_killer`), and each failure reports the input it replayed and
    :func:`compare_phases` what a longer replay cost. Two latencies: "emit" (source emit -> release, the engine's definition;
    a replayed element counts from its re-emission) and "end-to-end" (scheduled
    availability -> release, which includes the outage and the backlog).
    """
    w = workload
    rate, warmup = w.rate, w.warmup
    with _workdir(w.workdir) as root:
        r = _run_eo(name, "exactly-once", snapshot_interval, w.elements, rate, w.partitions, w.parallelism, root,
                    kill_at=tuple(kill_at), settle=settle, kill_phases=tuple(kill_phases), **run)
    m, epoch, kills = r["metrics"], r["epoch"], r["kills"]
    timed = [row for row in r["rows"] if row[2] is not None]
    sched = {row[0]: epoch + row[0] / rate for row in timed}
    emit_pts = sorted((rel, (rel - e) * 1000.0) for i, e, rel, _ in timed)
    e2e_pts = sorted((rel, (rel - sched[i]) * 1000.0) for i, _, rel, _ in timed)
    first_kill = kills[0]["kill_at"] if kills else float("inf")
    steady = [(i, e, rel) for i, e, rel, _ in timed if i >= warmup * rate and rel < first_kill]
    base_emit = _ms([rel - e for _, e, rel in steady])
    base_e2e = _ms([rel - sched[i] for i, _, rel in steady])
    recoveries = sorted(m.recovery_s, key=lambda x: x["detected_at"])
    failures = []
    used: set = set()
    for k, kill in enumerate(kills):
        t_kill = kill["kill_at"]
        t_next = kills[k + 1]["kill_at"] if k + 1 < len(kills) else float("inf")
        f: dict = {"planned_s": kill["planned_s"], "killed_at_s": kill["at_s"]}
        if "phase_s" in kill:
            f["phase_s"], f["kill_after_commit_s"] = kill["phase_s"], t_kill - kill["commit_seen_at"]
            if kill["snapshot_ts"] is not None:
                # Input released up to the kill that the rollback reads and processes again.
                f["replayed_elements"] = max(0, int((t_kill - epoch) * rate) - int(kill["snapshot_ts"]) - 1)
        rec = next((x for j, x in enumerate(recoveries) if j not in used and x["detected_at"] >= t_kill - 0.01), None)
        if rec is not None:
            used.add(recoveries.index(rec))
            detected = rec["detected_at"]
            f["kill_to_detected_s"] = detected - t_kill
            f["kill_to_restored_s"] = detected - t_kill + rec["restored_s"]
            f["kill_to_first_output_s"] = None if rec["first_output_s"] is None else detected - t_kill + rec["first_output_s"]
            f["restored_from_snapshot"] = rec.get("snapshot")
            f["restore_steps_s"] = rec.get("steps_s") or {}
            f["resets_s"] = rec.get("resets_s") or {}
            # New output: elements emitted by source partitions the recovery reopened. (Emit
            # time alone does not tell: the old actors run on for a few ms after detection.)
            t_next_detected = next((x["detected_at"] for x in recoveries if x["detected_at"] > detected), float("inf"))
            new = [rel for _, _, rel, opened in timed if detected <= opened < t_next_detected and rel < t_next]
            if new:
                first_new = min(new)
                f["kill_to_first_output_elements_s"] = first_new - t_kill
                for label, pts, base in (("emit", emit_pts, base_emit), ("end_to_end", e2e_pts, base_e2e)):
                    series = _windows_after(pts, first_new, t_next, window)
                    back = next((w for w in series if base.get("count") and w[2] <= base["p99"]), None)
                    f[f"kill_to_back_under_p99_{label}_s"] = None if back is None else back[0] + window - t_kill
                    f[f"peak_{label}_ms"] = max((w[5] for w in series), default=None)
                    f[f"windows_{label}"] = [[round(w[0] - t_kill, 3)] + [round(v, 3) for v in w[1:]] for w in series]
        failures.append(f)
    return {
        "config": {"rate": rate, "seconds": w.seconds, "partitions": w.partitions, "parallelism": w.parallelism,
                   "snapshot_interval": snapshot_interval, "kill_at": list(kill_at), "warmup_s": warmup, "window_s": window,
                   "settle_s": settle},
        "actor": f"{name}/by_key/0",
        "kills": len(kills),
        "recoveries": m.recoveries,
        "snapshots": m.snapshots,
        "snapshot_s": _stats_s(m.snapshot_s),
        "pre_failure_latency_ms": base_emit,
        "pre_failure_end_to_end_ms": base_e2e,
        "failures": failures,
        "by_phase": compare_phases(failures) if kill_phases else None,
        "engine_latency_ms_last_attempt": dict(m.latency_ms),
        "wall_s": m.wall_time,
        "check": r["check"],
    }


def compare_phases(failures: list) -> list:
    """Per kill phase: how many failures, and the medians of the input each replayed, of
    kill -> restored, -> first new output and -> latency back (emit). The difference
    between a short phase and a long one is what replaying more costs a global rollback:
    all a local recovery (only the lost instance replays its share) could save.

    >>> compare_phases([{"phase_s": 0.9, "replayed_elements": 1800, "kill_to_first_output_s": 0.5},
    ...                 {"phase_s": 0.1, "replayed_elements": 200, "kill_to_first_output_s": 0.25},
    ...                 {"phase_s": 0.9, "replayed_elements": 1700, "kill_to_first_output_s": 0.75}])
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'phase_s': 0.1, 'failures': 1, 'replayed_elements': 200, 'kill_to_restored_s': None, 'kill_to_first_output_s': 0.25,
      'kill_to_back_under_p99_emit_s': None},
     {'phase_s': 0.9, 'failures': 2, 'replayed_elements': 1750.0, 'kill_to_restored_s': None, 'kill_to_first_output_s': 0.625,
      'kill_to_back_under_p99_emit_s': None}]
    """
    rows = []
    for phase in sorted({f["phase_s"] for f in failures if "phase_s" in f}):
        group = [f for f in failures if f.get("phase_s") == phase]
        row: dict = {"phase_s": phase, "failures": len(group)}
        for key in ("replayed_elements", "kill_to_restored_s", "kill_to_first_output_s", "kill_to_back_under_p99_emit_s"):
            values = [f[key] for f in group if f.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        rows.append(row)
    return rows


@contextlib.contextmanager
def _workdir(path: Optional[str]):
    if path is not None:
        os.makedirs(path, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="driftstream-eo-bench-") as d:
        yield d


def exactly_once(
    intervals: tuple = (0.05, 0.5, 1.0), recovery_interval: float = 1.0, kill_at: tuple = (3.0, 6.0), workload: Workload = Workload(),
    standbys: int = 0, kill_phases: tuple = (), settle: float = 1.0, with_none: bool = True, span: Optional[float] = None,
) -> dict:
    """Every exactly-once figure: :func:`latency_under_snapshots`, then :func:`recovery`
    (no recovery run when ``kill_at`` is empty; with ``standbys`` spare actors and the
    ``kill_phases`` after snapshots), both on ``workload``."""
    lat = latency_under_snapshots(workload, intervals=tuple(intervals), with_none=with_none, span=span) if intervals else {"runs": [], "floors": {}}
    rec = recovery(workload, snapshot_interval=recovery_interval, kill_at=tuple(kill_at), standbys=standbys,
                   kill_phases=tuple(kill_phases), settle=settle) if kill_at else None
    return {
        "config": dict(asdict(workload), intervals=list(intervals), keys=EO_KEYS, workdir=None),
        "latency": lat["runs"],
        "floors": lat["floors"],
        "recovery": rec,
    }


def _f(v: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def format_latency(runs: list, floors: dict, rate: float, warmup: float) -> str:
    """The latency table, the floors, snapshot durations, and latency during / outside snapshots."""
    lines = [
        f"release latency (source emit -> barrier release, ms; first {warmup:g} s of input skipped as warm-up) at {rate:,.0f} elements/s:",
        f"  {'configuration':<20}" + "".join(f"{k:>8}" for k in _LAT_FIELDS) + f"{'count':>8}   | whole run (engine): {'p50':>6} {'p99':>6} | end-to-end p50  p99",
    ]
    for r in runs:
        lat, eng, e2e = r["latency_ms"], r["engine_latency_ms"], r["end_to_end_ms"]
        lines.append(
            f"  {r['config']:<20}" + "".join(f"{_f(lat.get(k)):>8}" for k in _LAT_FIELDS) + f"{lat.get('count', 0):>8}"
            + f"   | {'':>19} {_f(eng.get('p50')):>6} {_f(eng.get('p99')):>6} | {_f(e2e.get('p50')):>14} {_f(e2e.get('p99')):>5}"
        )
    if "p50_minus_none_ms" in floors:
        diffs = ", ".join(f"{d:+.2f} ms at {iv} s" for iv, d in floors["p50_minus_none_ms"].items())
        lines.append(f"floor: exactly-once p50 within 5 ms of none: {diffs} -> {'met' if floors['p50_within_5ms'] else 'NOT met'}")
    if "p99_max_over_min" in floors:
        lines.append(f"floor: exactly-once p99 across intervals within 20%: max/min {floors['p99_max_over_min']:.3f} -> "
                     f"{'met' if floors['p99_within_20pct'] else 'NOT met'}")
    eo = [r for r in runs if r["guarantee"] == "exactly-once"]
    if eo:
        lines.append("snapshot duration (marker -> every part durable), ms:")
        lines.append(f"  {'interval':<10}{'count':>7}{'median':>9}{'p95':>9}{'max':>9}")
        for r in eo:
            s = r["snapshot_s"]
            ms = {k: None if s.get(k) is None else s[k] * 1000.0 for k in ("median", "p95", "max")}
            lines.append(f"  {r['snapshot_interval']:<10g}{s['count']:>7}{_f(ms['median']):>9}{_f(ms['p95']):>9}{_f(ms['max']):>9}")
        if all("during_snapshot_ms" in r for r in eo):
            lines.append("latency of elements released during a snapshot (marker -> parts durable) vs. outside, ms:")
            lines.append(f"  {'interval':<10}{'during: p50':>12}{'p99':>8}{'max':>8}{'count':>7}  |{'outside: p50':>13}{'p99':>8}{'max':>8}{'count':>7}")
            for r in eo:
                d, o = r["during_snapshot_ms"], r["outside_snapshot_ms"]
                lines.append(f"  {r['snapshot_interval']:<10g}{_f(d.get('p50')):>12}{_f(d.get('p99')):>8}{_f(d.get('max')):>8}{d.get('count', 0):>7}  |"
                             f"{_f(o.get('p50')):>13}{_f(o.get('p99')):>8}{_f(o.get('max')):>8}{o.get('count', 0):>7}")
        else:
            lines.append("latency during vs. outside snapshots: not derivable (snapshot times unavailable); see the table by interval")
    for r in runs:
        sp = r.get("spans")
        if sp:
            from driftstream.examples.benchmarks.soak import compare_figures

            lines.append(f"{r['config']}, the first and the last {sp['span_s']:g} s of input:")
            for label, key in (("emit -> release", "ms"), ("end to end", "end_to_end_ms")):
                first, last = ({q: None if f.get(f"p{q}") is None else round(f[f"p{q}"], 2) for q in (50, 95, 99)}
                               for f in (sp[f"first_{key}"], sp[f"last_{key}"]))
                lines.append("  " + compare_figures(label, first, last))
            if sp["rss_mb"]:
                lines.append(f"  RSS of every actor, MiB, every {sp['span_s'] / 5:g} s: "
                             + "; ".join(f"{t:g} s: " + " ".join(f"{v:.0f}" for _, v in sorted(m.items())) for t, m in sp["rss_mb"]))
    for r in runs:
        c = r["check"]
        if not c["exactly_once"]:
            lines.append(f"OUTPUT CHECK FAILED for {r['config']}: {c}")
    lines.append("output: every configuration released each of its "
                 f"{runs[0]['check']['elements']:,} elements exactly once, in order, with the right rolling hash"
                 if all(r["check"]["exactly_once"] for r in runs) else "output: see the failed checks above")
    return "\n".join(lines)


def format_recovery(rec: dict) -> str:
    c = rec["config"]
    b, be = rec["pre_failure_latency_ms"], rec["pre_failure_end_to_end_ms"]
    lines = [
        f"recovery: exactly-once, snapshot interval {c['snapshot_interval']:g} s, {c['rate']:,.0f} elements/s for {c['seconds']:g} s, "
        f"{rec['actor']} killed at " + ", ".join(f"{k:g}" for k in c["kill_at"]) + " s of input "
        f"({rec['kills']} kills, {rec['recoveries']} recoveries, {rec['snapshots']} snapshots)",
        f"  pre-failure latency (after warm-up): emit p50 {_f(b.get('p50'))} p99 {_f(b.get('p99'))} ms; "
        f"end-to-end p50 {_f(be.get('p50'))} p99 {_f(be.get('p99'))} ms",
    ]
    for k, f in enumerate(rec["failures"], 1):
        late = f["killed_at_s"] - f["planned_s"]
        lines.append(f"  failure {k} (kill at {f['killed_at_s']:.2f} s of input"
                     + (f", {late:.2f} s after the planned {f['planned_s']:g} s: waited for the previous recovery" if late > 0.1 else "") + "):")
        if "kill_to_detected_s" not in f:
            lines.append("    no recovery matched this kill")
            continue
        fo = f["kill_to_first_output_s"]
        sid = f.get("restored_from_snapshot")
        lines.append("    restored from " + ("the start (no snapshot yet)" if sid is None else f"snapshot {sid}")
                     + ("" if "phase_s" not in f else f"; killed {f['kill_after_commit_s']:.3f} s after snapshot {sid} was committed, "
                        f"{_f(f.get('replayed_elements'), '{:,}')} elements to replay"))
        if f.get("restore_steps_s"):
            lines.append("    detected -> restored: " + recovery_steps(f["restore_steps_s"]))
        if f.get("resets_s"):
            lines.append("    resets: " + recovery_resets(f["resets_s"]))
        lines.append(f"    kill -> detected {f['kill_to_detected_s']:.3f} s, -> restored {f['kill_to_restored_s']:.3f} s, "
                     f"-> first new output {_f(fo, '{:.3f}')} s (per-element data: {_f(f.get('kill_to_first_output_elements_s'), '{:.3f}')} s)"
                     f"; floor < 3 s: {'met' if fo is not None and fo < 3.0 else 'NOT met'}")
        if "kill_to_back_under_p99_emit_s" in f:
            trace = f.get("windows_end_to_end") or []
            lines.append(f"    end-to-end latency per {c['window_s']:g} s window from the first new output, p50/p99 ms: "
                         + ", ".join(f"{w[2]:.0f}/{w[4]:.0f}" for w in trace[:8]) + (" ..." if len(trace) > 8 else ""))
            lines.append(
                f"    kill -> latency back under pre-failure p99 (first {c['window_s']:g} s window with p95 <= it): "
                f"emit {_f(f['kill_to_back_under_p99_emit_s'], '{:.3f}')} s (peak {_f(f['peak_emit_ms'], '{:.1f}')} ms), "
                f"end-to-end {_f(f['kill_to_back_under_p99_end_to_end_s'], '{:.3f}')} s (peak {_f(f['peak_end_to_end_ms'], '{:.1f}')} ms)")
    if rec.get("by_phase"):
        lines.append("  by kill phase (medians; the phase is the time from a snapshot's commit to the kill):")
        lines.append(f"    {'phase s':>8}{'kills':>6}{'replayed':>10}{'restored s':>12}{'first output s':>16}{'latency back s':>16}")
        for row in rec["by_phase"]:
            lines.append(f"    {row['phase_s']:>8g}{row['failures']:>6}{_f(row['replayed_elements'], '{:,.0f}'):>10}"
                         f"{_f(row['kill_to_restored_s'], '{:.3f}'):>12}{_f(row['kill_to_first_output_s'], '{:.3f}'):>16}"
                         f"{_f(row['kill_to_back_under_p99_emit_s'], '{:.3f}'):>16}")
    ch = rec["check"]
    lines.append(f"  output: {ch['lines']:,} of {ch['elements']:,} elements, {ch['duplicates']} duplicates, {ch['missing']} missing, "
                 f"{ch['wrong_hash']} wrong hashes, in order: {ch['in_order']} -> exactly-once {'holds' if ch['exactly_once'] else 'BROKEN'}"
                 + (f" ({ch['no_release_time']} elements lost their release time to a kill)" if ch["no_release_time"] else ""))
    return "\n".join(lines)


def _floats(text: str) -> tuple:
    return tuple(float(x) for x in text.split(",") if x.strip())


def demo(argv: Optional[list] = None) -> int:
    """``driftstream demo``: the inverted index, exactly-once, checked against PySpark."""
    from driftstream.examples.prerequisites import DEMO, require

    require("driftstream demo", DEMO)
    from driftstream.examples.inverted_index.benchmark import main as demo_main

    return demo_main(argv or [], demo=True)


#: ``driftstream bench NAME ...`` handed whole to the module's ``main`` (its own options);
#: the benchmark workload lives with its example (PySpark corpus, Spark baseline)
DELEGATED = {
    "soak": "driftstream.examples.benchmarks.soak",
    "broker-log": "driftstream.examples.benchmarks.broker_log",
    "kafka-codecs": "driftstream.examples.benchmarks.kafka_codecs",
    "keyed-sink": "driftstream.examples.benchmarks.keyed_sink",
    "sinks": "driftstream.examples.benchmarks.sinks",
    "cdc": "driftstream.examples.benchmarks.cdc",
    "backlog": "driftstream.examples.benchmarks.backlog",
    "rescale": "driftstream.examples.benchmarks.rescale",
    "local-recovery": "driftstream.examples.benchmarks.local_recovery",
    "replicas": "driftstream.examples.benchmarks.replicas",
    "step-costs": "driftstream.examples.benchmarks.step_costs",
    "index-stage": "driftstream.examples.benchmarks.index_stage",
    "acker": "driftstream.examples.benchmarks.acker_capacity",
    "nexmark": "driftstream.examples.nexmark.bench",
    "inverted-index": "driftstream.examples.inverted_index.benchmark",
}


def main(argv: Optional[list] = None) -> int:
    """``driftstream bench ...``: every benchmark harness."""
    if argv and argv[0] in DELEGATED:
        return importlib.import_module(DELEGATED[argv[0]]).main(argv[1:])
    parser = argparse.ArgumentParser(prog="driftstream bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    sub.add_parser("soak", help="a Kafka flow with keyed state at a steady rate for a long time, checked exactly-once (--help for options)")
    sub.add_parser("broker-log", help="a broker's fetch answer as its log grows, and whether DeleteRecords and retention cut the log (--help for options)")
    sub.add_parser("inverted-index", help="driftstream vs Spark Structured Streaming on the inverted index (--help for options)")
    sub.add_parser("nexmark", help="Nexmark q1, q2, q3, q5, q7, q8: events/s over a backlog and latency at a fixed rate (--help for options)")
    sub.add_parser("backlog", help="the inverted index over a backlog: docs/s as the index grows, entry vs value state (--help for options)")
    sub.add_parser("sinks", help="PostgresSink and IcebergSink on the inverted index: rows/s over a backlog and latency at 50 docs/s, against a FileSink (--help for options)")
    sub.add_parser("cdc", help="PostgresSource into an upsert PostgresSink: changes/s over a backlog, commit-to-copy latency at 50 updates/s (--help for options)")
    sub.add_parser("step-costs", help="µs per element of each step kind in one process, the engine's part beside the user's function (--help for options)")
    sub.add_parser("index-stage", help="the inverted index's stages in one process with their RocksDB state and snapshots: "
                   "µs a change record per part (--help for options)")
    sub.add_parser("acker", help="the acker's capacity: acks/s it folds (in one process, and on Ray from synthetic senders, with or "
                   "without shards) and the acks/s the inverted index and Nexmark q5 send it (--help for options)")
    sub.add_parser("kafka-codecs", help="KafkaSink's compression: CPU and bytes per codec on the inverted index's output (--help for options)")
    sub.add_parser("keyed-sink", help="KafkaSink(key=...) against the unkeyed sink: a partition's write and a flow on Ray, records/s (--help for options)")
    sub.add_parser("rescale", help="the inverted index rescaled while it runs (2 -> 3 -> 2): downtime at the output's consumer, "
                   "the engine's drain / restart, output checked (--cluster: on two Ray nodes; --help for options)")
    sub.add_parser("local-recovery", help="a stateful instance killed at parallelism 4, recovery='local' against 'global' in one "
                   "invocation: its first output after the kill, the others' longest output gap, restores (--help for options)")
    sub.add_parser("replicas", help="replicas=2 at 300 elements/s, a stateful instance's primary killed: the longest output gap with and "
                   "without the kill, restores; throughput replicas=2 against 1 (--help for options)")
    wc = sub.add_parser("wordcount", help="word count throughput and release latency")
    wc.add_argument("--lines", type=int, default=40_000, help="lines (10 words each) for the throughput run")
    wc.add_argument("--rate", type=float, default=1_000, help="words/s for the latency run")
    wc.add_argument("--seconds", type=float, default=10.0, help="length of the latency run")
    wc.add_argument("--parallelism", "-p", type=int, default=2)
    wc.add_argument("--address", default=None)
    wc.add_argument("--json", default=None, help="also write the figures to this file")
    eo = sub.add_parser(
        "exactly-once",
        help="release latency under snapshots (none vs. exactly-once at several intervals) and recovery times",
        description="Runs on a local Ray (one machine: the source shares its clock through a file). "
        "Default: 4 latency runs + 1 recovery run of 10 s each, about 70 s in all.",
    )
    eo.add_argument("--rate", type=float, default=2_000, help="elements/s (default 2,000)")
    eo.add_argument("--seconds", type=float, default=10.0, help="seconds of input per configuration (default 10)")
    eo.add_argument("--partitions", type=int, default=3, help="source partitions (default 3)")
    eo.add_argument("--parallelism", "-p", type=int, default=2)
    eo.add_argument("--intervals", type=_floats, default=(0.05, 0.5, 1.0), help="snapshot intervals in s, comma-separated (default 0.05,0.5,1.0)")
    eo.add_argument("--warmup", type=float, default=1.0, help="seconds of input left out of the latency figures (default 1)")
    eo.add_argument("--recovery-interval", type=float, default=1.0, help="snapshot interval of the recovery run (default 1.0)")
    eo.add_argument("--kill-at", type=_floats, default=(3.0, 6.0), help="seconds into the recovery run's input to kill the stateful actor; empty: no recovery run")
    eo.add_argument("--standbys", type=int, default=0, help="spare actors of the recovery run: a standby takes the killed one's place")
    eo.add_argument("--no-none", action="store_true", help="latency runs: exactly-once only, no guarantee-none run to compare with")
    eo.add_argument("--spans", type=float, default=None, metavar="S",
                    help="latency runs: also compare the first and the last S seconds of input (a long run; e.g. --seconds 1800 --spans 300)")
    eo.add_argument("--settle", type=float, default=1.0,
                    help="seconds a kill waits after the previous recovery's first output (default 1; a standby starts 2 s after a recovery)")
    eo.add_argument("--kill-phases", type=_floats, default=(), metavar="S,S,...",
                    help="each kill waits for a snapshot's commit, then these seconds in turn: "
                    "what a longer replay costs the rollback (e.g. 0.05,0.9 with --recovery-interval 1)")
    eo.add_argument("--metrics-ab", type=int, default=0, metavar="ROUNDS",
                    help="instead: the metrics export's cost, exactly-once at the first interval with the export off then on, "
                    "ROUNDS times in turn (run with RAY_enable_metrics_collection=1)")
    eo.add_argument("--metrics-interval", type=float, default=RunConfig.metrics_interval, help="seconds between metrics exports (default %(default)g)")
    eo.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from driftstream.engine.runtime.ray_session import ensure_ray

    started = ensure_ray(getattr(args, "address", None))
    try:
        if args.bench == "exactly-once":
            return _main_exactly_once(args)
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


def _main_metrics_cost(args: argparse.Namespace, workload: Workload, load: Optional[float], started: float) -> int:
    from driftstream.engine.control.metrics_export import collection_enabled

    cost = metrics_export_cost(workload, args.intervals[0] if args.intervals else 1.0, args.metrics_ab, args.metrics_interval)
    print(format_metrics_cost(cost, args.rate, args.metrics_interval, collection_enabled()))
    _close(cost, load, started, args.json)
    return 0 if all(r["check"]["exactly_once"] for r in cost["runs"]) else 1


def _close(figures: dict, load: Optional[float], started: float, json_path: Optional[str]) -> None:
    """The load average before and after (into ``figures`` too), the bench's time, and the JSON file."""
    if load is not None:
        figures["load_average_1min"] = {"before": load, "after": os.getloadavg()[0]}
        print(f"load average (1 min) before {load:.2f}, after {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"total bench time {time.time() - started:.1f} s")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(figures, fh, indent=2)


def _main_exactly_once(args: argparse.Namespace) -> int:
    print(f"exactly-once bench: {args.rate:,.0f} elements/s, {args.partitions} partitions, parallelism {args.parallelism}, "
          f"{args.seconds:g} s per configuration; key_by -> stateful_map (rolling hash, {EO_KEYS} keys) -> FileSink", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.time()
    workload = Workload(rate=args.rate, seconds=args.seconds, partitions=args.partitions, parallelism=args.parallelism, warmup=args.warmup)
    if args.metrics_ab:
        return _main_metrics_cost(args, workload, load, started)
    figures = exactly_once(args.intervals, args.recovery_interval, args.kill_at, workload, standbys=args.standbys,
                           kill_phases=args.kill_phases, settle=args.settle, with_none=not args.no_none, span=args.spans)
    if figures["latency"]:  # --intervals '': the recovery run alone
        print(format_latency(figures["latency"], figures["floors"], args.rate, args.warmup))
    if figures["recovery"] is not None:
        print(format_recovery(figures["recovery"]))
    _close(figures, load, started, args.json)
    ok = all(r["check"]["exactly_once"] for r in figures["latency"])
    if figures["recovery"] is not None:
        ok = ok and figures["recovery"]["check"]["exactly_once"]
    return 0 if ok else 1
