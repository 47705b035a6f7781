"""The inverted-index benchmark: driftstream against Spark Structured Streaming, side by side.

Every run uses the same corpus slice, the same paced feeder (Poisson arrivals)
and the same measuring consumer (:mod:`.measure`), on fresh topics of one local
(or given) broker. A document's latency is from ``sent_at_ms`` until its last
change record was read from the output topic; the first ``skip`` documents of
every run are left out. Each run's output is checked against the PySpark
ground truth (every word's ``df`` sequence and the rebuilt index).

    driftstream bench inverted-index                 # grid, rate ladder, recovery; results/ + plots
    driftstream bench inverted-index --quick         # a short grid only
    driftstream bench inverted-index --throughput    # backlog throughput, engine against engine (throughput.py)
    driftstream bench inverted-index --throughput --basis files   # the same from and to files, no broker (files_basis.py)
    driftstream demo                                 # README's first command: EO at 50 docs/s, ~1 min

Python::

    bench = Benchmark(corpus_path, bootstrap_servers)      # doctest: +SKIP
    run = bench.run(Config("driftstream", "exactly-once", snapshot_interval=0.05), rate=50, docs=1000)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from driftstream.engine.cli.status_view import recovery_resets, recovery_steps
from driftstream.engine.model.result import percentiles

from .documents import rebuild_index
from .feeder import Feeder, create_topic
from .measure import OutputMeter, document_latencies

#: Output topic partitions = driftstream's parallelism (one barrier writes each).
PARALLELISM = 2


@dataclass(frozen=True)
class Config:
    """One engine configuration. ``engine``: "driftstream" or "spark".

    >>> Config("driftstream", export_metrics=False).label
    'driftstream EO 1 s, no metrics export'
    """

    engine: str
    guarantee: str = "exactly-once"
    snapshot_interval: float = 1.0
    trigger: str = "100ms"
    #: driftstream's index step: "entries" (MapState) or "value" (the dict copied per change)
    state: str = "entries"
    #: driftstream's spare actors: a recovery resets one in the killed actor's place
    standbys: int = 0
    #: driftstream's figures as Ray metrics (where Ray collects metrics)
    export_metrics: bool = True
    #: driftstream's parallelism at the start (a rescale run moves it, see ``Benchmark.run``)
    parallelism: int = PARALLELISM
    #: more run options of driftstream's, ``((name, value), ...)`` (the --ab runs)
    options: tuple = ()

    @property
    def label(self) -> str:
        if self.engine == "spark":
            return f"spark EO trigger {self.trigger}"
        suffix = ("" if self.state == "entries" else ", value state") + ("" if self.export_metrics else ", no metrics export")
        suffix += "".join(f", {k}={_shown(v)}" for k, v in self.options)
        if self.guarantee == "none":
            return "driftstream none" + suffix
        return f"driftstream EO {_interval(self.snapshot_interval)}" + suffix


def _shown(value: Any) -> str:
    """An --ab option's value in a label: TLS files as "on"."""
    return "on" if isinstance(value, dict) else str(value)


def _interval(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:g} s"


#: The grid of the issue: driftstream none and exactly-once x three snapshot intervals, Spark x three triggers.
GRID = [
    Config("driftstream", "none"),
    Config("driftstream", "exactly-once", 0.05),
    Config("driftstream", "exactly-once", 0.5),
    Config("driftstream", "exactly-once", 1.0),
    Config("spark", trigger="0"),
    Config("spark", trigger="100ms"),
    Config("spark", trigger="1s"),
]


@dataclass
class RunResult:
    """What one run measured. ``latency_ms``: p50/p75/p95/p99/max/count after the skip;
    ``timeline``: ``(seconds since the first send, latency ms)`` per document; ``kept_ms``:
    the latencies the percentiles are over (the documents after the skip)."""

    label: str
    config: dict
    rate: float
    docs: int
    achieved_rate: float
    latency_ms: dict
    records: int
    expected_records: int
    duplicates: int
    incomplete: int
    problems: list
    timeline: list = field(default_factory=list)
    kept_ms: list = field(default_factory=list)
    rounds: list = field(default_factory=list)
    failures_at_s: list = field(default_factory=list)
    recovery_s: list = field(default_factory=list)
    #: per kill, the engine's own timings (driftstream): kill -> restored, -> first new output, and where the time went
    recovery_engine: list = field(default_factory=list)
    #: per rescale (driftstream): the engine's report and the output consumer's downtime (see :func:`rescale_downtimes`)
    rescales: list = field(default_factory=list)
    engine: dict = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return not self.problems and self.duplicates == 0 and self.incomplete == 0


class Benchmark:
    """Runs configurations against one broker and corpus; ``truth`` (a GroundTruth) enables the check."""

    def __init__(
        self,
        corpus: Any,
        bootstrap_servers: str,
        truth: Any = None,
        skip: int = 200,
        workdir: Optional[str] = None,
        progress: Optional[Callable[[str, int, int, int, int], None]] = None,
    ) -> None:
        from .corpus import read_corpus

        self.table = read_corpus(corpus) if isinstance(corpus, (str, os.PathLike)) else corpus
        self.bootstrap_servers = bootstrap_servers
        self.truth = truth
        self.skip = skip
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="driftstream-bench-"))
        self.progress = progress or (lambda *a: None)

    def run(self, config: Config, rate: float, docs: int, kill_at: tuple = (), drain_timeout: Optional[float] = None,
            rescale_at: tuple = ()) -> RunResult:
        """Feed ``docs`` documents at ``rate`` docs/s through ``config``; ``kill_at``: seconds
        after the first send at which to kill a stateful driftstream actor (recovery runs);
        ``rescale_at``: ``(seconds after the first send, parallelism)`` pairs at which to
        rescale the running driftstream flow (``FlowHandle.rescale``; the output topic gets
        as many partitions as the largest parallelism)."""
        tag = uuid.uuid4().hex[:8]
        in_topic, out_topic = f"ii-{tag}-in", f"ii-{tag}-out"
        create_topic(self.bootstrap_servers, in_topic, 1)
        create_topic(self.bootstrap_servers, out_topic, max([config.parallelism] + [p for _, p in rescale_at]))
        feeder = Feeder(self.table, self.bootstrap_servers, in_topic, rate=rate, limit=docs)
        expected = sum(feeder.expected_n_changes)
        engine = _start_engine(config, self.bootstrap_servers, in_topic, out_topic, self.workdir / tag, tag)
        meter = OutputMeter(self.bootstrap_servers, out_topic).start()
        kills: list = []
        rescales: list = []  # (wall time of the call, the engine's report, wall time it returned)
        try:
            feeder.start()
            t0 = time.time()
            actions = sorted([(s, "kill", None) for s in kill_at] + [(s, "rescale", p) for s, p in rescale_at], key=lambda a: a[0])
            while not feeder.join(timeout=0.2):
                while actions and time.time() - t0 >= actions[0][0]:
                    _, what, parallelism = actions.pop(0)
                    if what == "kill":
                        kills.append(engine.kill_stateful_actor())
                    else:
                        rescales.append(engine.rescale(parallelism))
                self.progress(config.label, len(feeder.sends), docs, meter.count, expected)
            # Spark may fall behind the feed (a micro-batch costs ~1 s here): let it drain.
            deadline = time.time() + (drain_timeout if drain_timeout is not None else max(120.0, docs / 5.0))
            while meter.count < expected and time.time() < deadline:
                self.progress(config.label, docs, docs, meter.count, expected)
                if not meter.wait_for(expected, timeout=1.0) and not engine.alive():
                    break
            self.progress(config.label, docs, docs, meter.count, expected)
        finally:
            arrivals = meter.stop()
            info = engine.stop()
        lat = document_latencies(feeder.sends, arrivals)
        records = [r for _, r in arrivals]
        first_send = feeder.sends[0].sent_at_ms if feeder.sends else 0.0
        timeline = [((d.sent_at_ms - first_send) / 1000.0, d.latency_ms) for d in lat.documents]
        result = RunResult(
            label=config.label,
            config=asdict(config),
            rate=rate,
            docs=docs,
            achieved_rate=feeder.achieved_rate or 0.0,
            latency_ms=lat.summary(self.skip),
            records=len(records),
            expected_records=expected,
            duplicates=lat.duplicates,
            incomplete=lat.incomplete,
            problems=self._check(records, expected) + self._locate_missing(feeder.sends, lat, in_topic),
            timeline=timeline,
            kept_ms=[d.latency_ms for d in lat.documents if d.seq >= self.skip],
            failures_at_s=[(k - first_send / 1000.0) for k in kills],
            engine=info,
        )
        result.recovery_s = recovery_times(timeline, result.failures_at_s)
        result.recovery_engine = engine_recoveries(kills, info.get("recoveries") or [])
        if rescales:
            result.rescales = rescale_downtimes([ms / 1000.0 for ms, _ in arrivals], rescales, first_send / 1000.0)
            # From the sources' stop: what was sent before it is released by the drain.
            back = recovery_times(timeline, [r["stopped_at_s"] for r in result.rescales])
            for r, b in zip(result.rescales, back):
                r["latency_back_under_p99_s"] = b
        return result

    def _locate_missing(self, sends: list, lat: Any, in_topic: str) -> list:
        """For each send whose change records did not all arrive: is it in the input topic
        (lost after the broker took it) or not (lost before: feeder or broker)?"""
        done = {d.seq for d in lat.documents}
        missing = [s for s in sends if s.n_changes > 0 and s.seq not in done]
        if not missing:
            return []
        from kafka import TopicPartition

        from driftstream.engine.connectors.kafka.io import consumer, read_partition

        c = consumer(self.bootstrap_servers)
        try:
            offsets: dict = {}
            for rec in read_partition(c, TopicPartition(in_topic, 0), 0, max_s=30.0):
                if not rec.value:  # the source's tick records
                    continue
                page = json.loads(rec.value).get("page_id")
                offsets.setdefault(page, []).append(rec.offset)
        finally:
            c.close()
        return [
            f"send #{s.seq} (page {s.page_id}) incomplete: "
            + (f"in the input topic at offset(s) {offsets[s.page_id]}" if s.page_id in offsets else "NOT in the input topic")
            for s in missing
        ]

    def _check(self, records: list, n_changes: int) -> list:
        if self.truth is None:
            return []
        from .ground_truth import check

        return check(records, truth_prefix(self.truth, n_changes))


def rotated_rounds(configs: list, rounds: int) -> list:
    """The run order of ``rounds`` interleaved rounds: round k starts at configuration k, so
    each configuration runs as often first as last (with as many rounds as configurations).
    A machine that gets slower over a round, or a broker that fills up over the
    benchmark, then weighs on every configuration alike.

    >>> rotated_rounds(["a", "b", "c"], 3)
    ['a', 'b', 'c', 'b', 'c', 'a', 'c', 'a', 'b']
    """
    n = len(configs)
    return [configs[(k + i) % n] for k in range(rounds) for i in range(n)] if n else []


def pooled(runs: list) -> RunResult:
    """Runs of one configuration (rounds interleaved with the other configurations) as one
    result: percentiles over every round's documents; each round's own in ``rounds``.

    Interleaving rounds spreads a shared machine's slow minutes over every configuration
    instead of charging them to whichever ran then.

    >>> a = RunResult("x", {}, 50, 10, 50, {}, 10, 10, 0, 0, [], kept_ms=[1.0, 2.0])
    >>> b = RunResult("x", {}, 50, 10, 48, {}, 10, 10, 0, 0, [], kept_ms=[3.0, 4.0])
    >>> r = pooled([a, b]); r.latency_ms["p50"], r.docs, r.achieved_rate
    (2.0, 20, 49.0)
    """
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    kept = [ms for r in runs for ms in r.kept_ms]
    return RunResult(
        label=first.label,
        config=first.config,
        rate=first.rate,
        docs=sum(r.docs for r in runs),
        achieved_rate=sum(r.achieved_rate for r in runs) / len(runs),
        latency_ms=percentiles(kept),
        records=sum(r.records for r in runs),
        expected_records=sum(r.expected_records for r in runs),
        duplicates=sum(r.duplicates for r in runs),
        incomplete=sum(r.incomplete for r in runs),
        problems=[p for r in runs for p in r.problems],
        kept_ms=kept,
        rounds=[{"latency_ms": r.latency_ms, "engine": r.engine} for r in runs],
    )


def truth_prefix(truth: Any, n_changes: int) -> Any:
    """The ground truth of the first sends only: their ``n_changes`` change records come first
    (``df`` depends only on what was sent before), and the index they rebuild."""
    from .ground_truth import GroundTruth

    changes = truth.changes[:n_changes]
    return GroundTruth(index=rebuild_index(changes), changes=changes)


def recovery_times(timeline: list, failures_at_s: list) -> list:
    """Per failure: seconds from the kill until latency is back under the pre-failure p99.

    Pre-failure p99: over the documents sent in the 10 s before the kill. Back under:
    the first document sent after the kill whose latency is below it, measured at its
    arrival (send time + latency).

    >>> tl = [(t / 10, 5.0) for t in range(100)] + [(10.0, 900.0), (10.5, 400.0), (11.0, 4.0)]
    >>> recovery_times(tl, [10.0])
    [1.004]
    """
    out = []
    for kill in failures_at_s:
        before = [lat for t, lat in timeline if kill - 10 <= t < kill]
        if not before:
            continue
        p99 = percentiles(before)["p99"]
        back = [t + lat / 1000.0 for t, lat in timeline if t >= kill and lat < p99]
        out.append(round(min(back) - kill, 3) if back else None)
    return out


def engine_recoveries(kills: list, recoveries: list) -> list:
    """Per kill (wall time), the first recovery detected after it, as seconds from the kill:
    ``restored``, ``first_output``, and ``status()["recoveries"]``'s ``steps_s`` and ``resets_s``.

    >>> engine_recoveries([10.0], [{"detected_at": 10.02, "restored_s": 0.15, "first_output_s": 0.16, "steps_s": {"reset": 0.05}}])
    [{'restored': 0.17, 'first_output': 0.18, 'steps_s': {'reset': 0.05}, 'resets_s': {}}]
    """
    out, left = [], sorted(recoveries, key=lambda r: r["detected_at"])
    for kill in kills:
        r = next((r for r in left if r["detected_at"] >= kill - 0.01), None)
        if r is None:
            out.append(None)
            continue
        left.remove(r)
        since = r["detected_at"] - kill
        first = r.get("first_output_s")
        out.append({"restored": round(since + r["restored_s"], 3), "first_output": None if first is None else round(since + first, 3),
                    "steps_s": r.get("steps_s") or {}, "resets_s": r.get("resets_s") or {}})
    return out


def rescale_downtimes(arrivals_s: list, rescales: list, first_send_s: float = 0.0, baseline_s: float = 5.0) -> list:
    """Per rescale, the engine's report and the downtime the output topic's consumer saw.

    ``arrivals_s``: wall times (s) at which the consumer received each output record;
    ``rescales``: ``(wall time handle.rescale was called, its report, wall time it
    returned)``. The report's ``at`` (the sources' stop), ``drain_s`` (to the drained
    snapshot's commit) and ``restart_s`` (to every actor running again) place the
    restart: no output can come between the commit and the end of the restart, so the
    records on either side of its middle are the last output before the rescale and the
    first after it. ``downtime_s`` is the time between them; ``baseline_gap_s`` the
    largest gap between two records in the ``baseline_s`` seconds before the call (what
    the input's own pauses make). Times ``*_s`` since ``first_send_s`` where they are
    points in time.

    >>> arrivals = [9.95, 10.0, 10.03, 10.05, 11.5, 11.52]
    >>> report = {"from": 2, "to": 3, "at": 10.045, "drain_s": 0.05, "restart_s": 0.4, "first_output_s": 1.3}
    >>> r = rescale_downtimes(arrivals, [(10.04, report, 11.6)], first_send_s=9.0)[0]
    >>> r["downtime_s"], r["last_before_s"], r["first_after_s"], r["baseline_gap_s"]
    (1.45, 1.05, 2.5, 0.05)
    """
    import bisect

    times = sorted(arrivals_s)
    out = []
    for called, report, returned in rescales:
        report = dict(report)
        middle = report["at"] + report["drain_s"] + report["restart_s"] / 2
        i = bisect.bisect_left(times, middle)
        before = times[i - 1] if i > 0 else None
        after = times[i] if i < len(times) else None
        window = times[bisect.bisect_left(times, called - baseline_s):bisect.bisect_left(times, called)]
        gaps = [b - a for a, b in zip(window, window[1:])]

        def since(t):
            return None if t is None else round(t - first_send_s, 3)

        out.append({
            "from": report.get("from"), "to": report.get("to"), "snapshot": report.get("snapshot"),
            "called_at_s": since(called), "stopped_at_s": since(report["at"]), "returned_after_s": round(returned - called, 3),
            "drain_s": report["drain_s"], "restart_s": report["restart_s"], "first_output_s": report.get("first_output_s"),
            "last_before_s": since(before), "first_after_s": since(after),
            "downtime_s": None if before is None or after is None else round(after - before, 3),
            "baseline_gap_s": round(max(gaps), 3) if gaps else None,
            "steps_s": report.get("steps_s") or {}, "resets_s": report.get("resets_s") or {},
            **({"placement": report["placement"]} if report.get("placement") else {}),
        })
    return out


# -- engines ------------------------------------------------------------------------------


class _Driftstream:
    def __init__(self, config: Config, bootstrap: str, in_topic: str, out_topic: str, workdir: Path, tag: str) -> None:
        from .pipeline import kafka_flow

        self.name = f"ii-{tag}"
        flow = kafka_flow(bootstrap, in_topic, out_topic, name=self.name, state=config.state)
        self.handle = flow.start(
            parallelism=config.parallelism,
            guarantee=config.guarantee,
            snapshot_interval=config.snapshot_interval,
            snapshot_dir=str(workdir / "snapshots"),
            standbys=config.standbys,
            export_metrics=config.export_metrics,
            **dict(config.options),
        )
        self._wait_running()
        self._killed = None

    def _wait_running(self, timeout: float = 120.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                status = self.handle.status()
            except Exception:  # the supervisor is still creating actors
                status = {"running": True}
            if not status.get("running", False):
                raise RuntimeError(f"driftstream flow failed to start: {status.get('error')}")
            if "watermark" in status:
                return
            time.sleep(0.1)
        raise TimeoutError("driftstream flow did not start within %s s" % timeout)

    def alive(self) -> bool:
        return bool(self.handle.status().get("running"))

    def kill_stateful_actor(self) -> float:
        import threading

        import ray

        from driftstream.engine.testing import wait_for_actor

        # After an earlier kill the replacement (a new actor, or a standby playing the
        # instance) may not be registered yet.
        stop = threading.Event()
        timer = threading.Timer(60, stop.set)
        timer.start()
        try:
            handle = wait_for_actor(f"{self.name}/by_word/0", self._killed, stop)
        finally:
            timer.cancel()
        if handle is None:
            raise TimeoutError(f"no actor plays {self.name}/by_word/0 after 60 s")
        ray.kill(handle, no_restart=True)
        self._killed = handle._actor_id
        return time.time()

    def rescale(self, parallelism: int) -> tuple:
        """``handle.rescale(parallelism)``: (wall time of the call, its report, wall time it returned)."""
        called = time.time()
        report = self.handle.rescale(parallelism)
        returned = time.time()
        return called, dict(report, placement=self.placement()), returned

    def placement(self) -> Optional[dict]:
        """On a cluster of several nodes: the number of the flow's live actors per node
        (``head``, ``worker <node id>``); None on one node. From the GCS actor table, as
        ``tests/engine/control/cluster_run.py`` reads it."""
        import ray

        nodes = [n for n in ray.nodes() if n["Alive"]]
        if len(nodes) < 2:
            return None
        label = {n["NodeID"]: "head" if "node:__internal_head__" in n["Resources"] else f"worker {n['NodeID'][:8]}" for n in nodes}
        counts: dict = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            if not a["name"].startswith(self.name + "/"):
                continue
            try:
                info = ray._private.state.actors(ray.get_actor(a["name"], namespace=a["namespace"])._actor_id.hex())
            except ValueError:
                continue  # gone since the listing
            if info.get("State") == "ALIVE":
                node = label.get(info["Address"]["NodeID"], info["Address"]["NodeID"][:8])
                counts[node] = counts.get(node, 0) + 1
        return counts

    def stop(self) -> dict:
        status = self.handle.status()
        result = self.handle.stop()
        snaps = result.metrics.snapshot_s
        return {
            "snapshots": result.metrics.snapshots,
            "snapshot_ms": percentiles([s * 1000.0 for s in snaps]) if snaps else {},
            "recoveries": status.get("recoveries", []),
            "parallelism": status.get("parallelism"),
            "dead_letters": result.metrics.dead_letters,
            # source emit -> barrier release, per input record (the engine's share of the latency)
            "release_latency_ms": result.metrics.latency_ms,
        }


class _Spark:
    def __init__(self, config: Config, bootstrap: str, in_topic: str, out_topic: str, workdir: Path, tag: str) -> None:
        from .spark_baseline import start_spark_baseline

        self.handle = start_spark_baseline(bootstrap, in_topic, out_topic, str(workdir / "checkpoint"), trigger=config.trigger)

    def alive(self) -> bool:
        return self.handle.alive()

    def kill_stateful_actor(self) -> float:
        raise ValueError("failure injection is for driftstream runs")

    def rescale(self, parallelism: int) -> tuple:
        raise ValueError("rescales are for driftstream runs")

    def stop(self) -> dict:
        self.handle.stop()
        return {}


def _start_engine(config: Config, bootstrap: str, in_topic: str, out_topic: str, workdir: Path, tag: str) -> Any:
    cls = {"driftstream": _Driftstream, "spark": _Spark}[config.engine]
    return cls(config, bootstrap, in_topic, out_topic, workdir, tag)


# -- suites -------------------------------------------------------------------------------


#: A step of the rate ladder counts at least this many documents (see :func:`rate_ladder`).
MIN_COUNTED = 500

#: Seconds of input per step of the rate ladder (at least MIN_COUNTED documents past the skipped ones).
STEP_SECONDS = 15.0


def step_docs(rate: float, skip: int, seconds: float = STEP_SECONDS, min_counted: int = MIN_COUNTED) -> int:
    """Documents one step of the rate ladder at ``rate`` sends: ``seconds`` of input, but at least
    ``min_counted`` past the ``skip`` first ones.

    >>> step_docs(10, 200), step_docs(100, 200)
    (700, 1500)
    """
    return max(skip + min_counted, int(rate * seconds))


def rate_ladder(
    bench: Benchmark, config: Config, rates: list, seconds: float = STEP_SECONDS, p99_limit_ms: float = 100.0, min_counted: int = MIN_COUNTED
) -> dict:
    """Raise the rate until p99 reaches ``p99_limit_ms`` or the feeder cannot keep up;
    returns the highest rate that stayed under, with every step's figures.

    A step runs ``seconds`` of input, but at least ``min_counted`` documents past the
    skipped ones: the ramp stops at the first miss, and a p99 over 100 documents is
    their second-worst, one stall of the shared machine."""
    steps, best = [], None
    for rate in rates:
        docs = min(len(bench.table), step_docs(rate, bench.skip, seconds, min_counted))
        r = bench.run(config, rate=rate, docs=docs)
        steps.append({"rate": rate, "achieved_rate": r.achieved_rate, "latency_ms": r.latency_ms, "correct": r.correct,
                      # source emit -> sink acknowledged: the engine's share of latency_ms
                      "engine_latency_ms": r.engine.get("release_latency_ms")})
        if r.latency_ms.get("p99", float("inf")) >= p99_limit_ms or r.achieved_rate < 0.9 * rate:
            break
        best = rate
    return {"label": config.label, "max_rate_p99_under_100ms": best, "steps": steps}


def write_results(results: dict, out_dir: str) -> dict:
    """Write ``results.json``, ``results.md`` and the PNG plots into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(results, indent=1, default=str))
    paths["markdown"].write_text(markdown(results))
    paths.update(plot(results, out))
    return {k: str(v) for k, v in paths.items()}


def markdown(results: dict) -> str:
    """The latency table (and throughput, recovery) as Markdown."""
    lines = [
        f"Inverted index, {results.get('rate', 50)} docs/s, {results.get('docs')} documents per run "
        f"(first {results.get('skip', 200)} skipped), machine: {results.get('machine', '')}",
        "",
        f"driftstream configurations: {results.get('rounds', 1)} interleaved round(s) each, in rotated order, percentiles over all of "
        "their documents; Spark: one run each.",
        "",
        "| configuration | p50 ms | p75 ms | p95 ms | p99 ms | max ms | docs | output correct |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results.get("grid", []):
        lat = r["latency_ms"]
        ok = "yes" if not r["problems"] and not r["duplicates"] and not r["incomplete"] else "NO"
        lines.append(
            f"| {r['label']} | {_f(lat.get('p50'))} | {_f(lat.get('p75'))} | {_f(lat.get('p95'))} | "
            f"{_f(lat.get('p99'))} | {_f(lat.get('max'))} | {lat.get('count', 0)} | {ok} |"
        )
    if results.get("floors"):
        lines += ["", "| floor | measured | met |", "|---|---|---|"]
        for f in results["floors"]:
            lines.append(f"| {f['floor']} | {f['measured']} | {'yes' if f['met'] else 'no'} |")
    if results.get("throughput"):
        lines += ["", "| engine | highest docs/s with p99 < 100 ms | steps (rate: p99 ms) |", "|---|---:|---|"]
        for t in results["throughput"]:
            steps = ", ".join(f"{s['rate']:g}: {_f(s['latency_ms'].get('p99'))}" for s in t["steps"])
            lines.append(f"| {t['label']} | {t['max_rate_p99_under_100ms'] or 'none'} | {steps} |")
    rec = results.get("recovery")
    if rec:
        lines += [
            "",
            f"Recovery ({rec['label']}, failures at {', '.join(f'{x:.1f}' for x in rec['failures_at_s'])} s): "
            f"kill -> latency back under the pre-failure p99 in {', '.join(_f(x, 2) + ' s' for x in rec['recovery_s'])}; "
            f"output correct: {'yes' if not rec['problems'] and not rec['duplicates'] and not rec['incomplete'] else 'NO'}",
        ]
        for k, e in enumerate(rec.get("recovery_engine") or [], 1):
            if e:
                lines.append(f"- kill {k}: restored {e['restored']:.3f} s, first new output {_f(e['first_output'], 3)} s after the kill "
                             f"(detected -> restored: {recovery_steps(e['steps_s'])}; resets: {recovery_resets(e['resets_s'])})")
    return "\n".join(lines) + "\n"


def _f(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def floors(grid: list, throughputs: list) -> list:
    """The issue's floors, evaluated on one run's figures."""
    by = {r["label"]: r["latency_ms"] for r in grid}
    out = []
    none = by.get("driftstream none", {})
    eos = {k: v for k, v in by.items() if k.startswith("driftstream EO")}
    sparks = {k: v for k, v in by.items() if k.startswith("spark")}
    for q in ("p50", "p99"):
        if eos and sparks:
            worst = max(v[q] for v in eos.values())
            best_spark = min(v[q] for v in sparks.values())
            out.append({
                "floor": f"driftstream EO {q} >= 10x lower than Spark EO at every trigger",
                "measured": f"worst driftstream EO {q} {worst:.1f} ms vs best Spark {q} {best_spark:.1f} ms ({best_spark / worst:.1f}x)",
                "met": best_spark >= 10 * worst,
            })
    if eos and none:
        diff = max(v["p50"] for v in eos.values()) - none["p50"]
        measured = f"+{diff:.2f} ms (worst interval, pooled p50s)"
        paired = round_differences(grid, "driftstream none", "p50")
        if paired:
            measured += "; per-round EO - none, median (rounds): " + "; ".join(
                f"{label.removeprefix('driftstream ')} {statistics.median(d):+.1f} ({', '.join(f'{x:+.1f}' for x in d)})"
                for label, d in paired.items()
            )
        out.append({"floor": "driftstream EO p50 within 5 ms of none", "measured": measured, "met": diff <= 5})
    tp = {t["label"]: t["max_rate_p99_under_100ms"] or 0 for t in throughputs}
    ds = max((v for k, v in tp.items() if k.startswith("driftstream")), default=None)
    sp = max((v for k, v in tp.items() if k.startswith("spark")), default=None)
    if ds is not None and sp is not None:
        out.append({"floor": "throughput at p99 < 100 ms higher than Spark's", "measured": f"{ds} vs {sp} docs/s", "met": ds > sp})
    return out


def round_differences(grid: list, base_label: str, q: str) -> dict:
    """Per driftstream EO configuration: its ``q`` minus ``base_label``'s, round by round.

    Round k of every configuration ran in the same stretch of time (interleaved), so
    these paired differences leave out most of what the machine's slow minutes add
    to both; their median is a steadier estimate than the difference of pooled figures.

    >>> g = [{"label": "driftstream none", "rounds": [{"latency_ms": {"p50": 10.0}}, {"latency_ms": {"p50": 20.0}}]},
    ...      {"label": "driftstream EO 50 ms", "rounds": [{"latency_ms": {"p50": 12.0}}, {"latency_ms": {"p50": 19.0}}]}]
    >>> round_differences(g, "driftstream none", "p50")
    {'driftstream EO 50 ms': [2.0, -1.0]}
    """
    by = {r["label"]: [x["latency_ms"][q] for x in r.get("rounds") or []] for r in grid}
    base = by.get(base_label) or []
    return {
        label: [a - b for a, b in zip(vals, base)]
        for label, vals in by.items()
        if label.startswith("driftstream EO") and base and len(vals) == len(base)
    }


def plot(results: dict, out: Path) -> dict:
    """PNG plots: latency percentiles per configuration; latency over time with failures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    grid = results.get("grid", [])
    if grid:
        qs = ["p50", "p75", "p95", "p99"]
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(grid)
        for i, r in enumerate(grid):
            vals = [max(r["latency_ms"].get(q, 0.0), 0.01) for q in qs]
            ax.bar([k + i * width for k in range(len(qs))], vals, width, label=r["label"])
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(qs))], qs)
        ax.set_yscale("log")
        ax.set_ylabel("latency, ms (log scale)")
        ax.set_title(f"Inverted index at {results.get('rate', 50)} docs/s: document latency percentiles")
        ax.legend(fontsize=8, ncol=2)
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        paths["percentiles_png"] = out / "latency_percentiles.png"
        fig.savefig(paths["percentiles_png"], dpi=110)
        plt.close(fig)
    rec = results.get("recovery")
    if rec and rec.get("timeline"):
        fig, ax = plt.subplots(figsize=(10, 4))
        xs, ys = zip(*rec["timeline"])
        ax.plot(xs, ys, ".", ms=2)
        for i, f in enumerate(rec["failures_at_s"]):
            ax.axvline(f, color="red", ls="--", lw=1, label="actor killed" if i == 0 else None)
        ax.set_yscale("log")
        ax.set_xlabel("time since first document, s")
        ax.set_ylabel("latency, ms (log scale)")
        ax.set_title(f"{rec['label']} at {rec['rate']:g} docs/s: latency over time with failures")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths["recovery_png"] = out / "latency_recovery.png"
        fig.savefig(paths["recovery_png"], dpi=110)
        plt.close(fig)
    return paths


def slim(r: RunResult, timeline: bool = False) -> dict:
    """A RunResult as JSON-ready dict (the per-document timeline only when asked)."""
    d = asdict(r)
    d.pop("kept_ms")
    if not timeline:
        d.pop("timeline")
    return d



# -- command line -------------------------------------------------------------------------


def prepare(workdir: Path, docs: int, source: str = "ovos", seed: int = 0, console: Any = None) -> tuple:
    """The corpus slice (PySpark, cached in ``workdir``) and its ground truth (PySpark batch)."""
    from .corpus import prepare_corpus
    from .ground_truth import ground_truth

    key = f"{Path(source).name if source != 'ovos' else 'ovos'}-{docs}-{seed}"
    corpus_dir = workdir / f"corpus-{key}"
    parquet = corpus_dir / "corpus.parquet"
    say = console.print if console is not None else (lambda message: None)
    if not parquet.exists():
        say(f"[bold]preparing[/] {docs} documents from {source} with PySpark -> {corpus_dir}")
        parquet = Path(prepare_corpus(str(corpus_dir), source=source, limit=docs, seed=seed))
    say(f"[bold]ground truth[/] (PySpark batch) for {parquet}")
    return str(parquet), ground_truth(str(parquet))


def _progress_display(console: Any) -> tuple:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.fields[sent]:>6} docs sent  {task.fields[received]:>8}/{task.fields[expected]} records"),
        TimeElapsedColumn(),
        console=console,
    )
    tasks: dict = {}

    def update(label: str, sent: int, docs: int, received: int, expected: int) -> None:
        if label not in tasks:
            tasks[label] = progress.add_task(label, total=expected, sent=0, received=0, expected=expected)
        progress.update(tasks[label], completed=received, total=expected, sent=sent, received=received, expected=expected)

    def reset() -> None:
        tasks.clear()

    return progress, update, reset


def latency_table(runs: list, title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in ("configuration", "p50 ms", "p75 ms", "p95 ms", "p99 ms", "max ms", "docs", "correct"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in runs:
        lat = r.latency_ms
        table.add_row(r.label, *(_f(lat.get(q)) for q in ("p50", "p75", "p95", "p99", "max")), str(lat.get("count", 0)),
                      "yes" if r.correct else "[red]NO[/]")
    return table


#: Flink's checkpoint intervals in the latency grid, seconds: its exactly-once output is
#: visible when a checkpoint commits, so these are its latency-relevant settings.
FLINK_CHECKPOINTS = (0.05, 1.0)


def flink_latency_runs(bench: Benchmark, rate: float, docs: int, python: str) -> list:
    """Flink's exactly-once job at ``rate`` over the grid's documents, one run per interval of
    :data:`FLINK_CHECKPOINTS`, as RunResults. Its input is files, not the Kafka topic
    (no Kafka jar here): see :mod:`.flink_baseline` for what differs."""
    from .flink_baseline import run_flink_latency

    rows = bench.table.sort_by("seq").slice(0, docs)
    documents = [{"page_id": p, "text": t} for p, t in zip(rows.column("page_id").to_pylist(), rows.column("text").to_pylist())]
    out = []
    for interval in FLINK_CHECKPOINTS:
        label = f"flink exactly-once, checkpoints {_interval(interval)} (files)"
        bench.progress(label, 0, docs, 0, 0)
        r = run_flink_latency(documents, bench.workdir / f"flink-{uuid.uuid4().hex[:8]}", rate=rate, checkpoint_interval=interval,
                              skip=bench.skip, python=python)
        out.append(RunResult(label=label, config={"engine": "flink", "checkpoint_interval": interval}, rate=rate, docs=docs,
                             achieved_rate=r.get("achieved_rate", 0.0), latency_ms=r.get("latency_ms", {}), records=0,
                             expected_records=0, duplicates=0, incomplete=0, problems=r["problems"]))
    return out


def _flink_python_or_none(console: Any) -> Optional[str]:
    """The interpreter with pyflink, or None (said once) when there is none."""
    from .flink_baseline import flink_python

    return _python_or_none(console, "flink", flink_python)


def _python_or_none(console: Any, engine: str, find: Any) -> Optional[str]:
    """``find()``, the interpreter of an engine kept out of driftstream's install, or None (said once)."""
    try:
        return find()
    except RuntimeError as e:
        console.print(f"[yellow]{engine} left out: {e}[/]")
        return None


def _throughput(args: Any, bootstrap: str, workdir: Path, console: Any, ray_session_s: Optional[float] = None) -> int:
    """``--throughput``: every engine over the same backlog; prints and writes the figures.

    driftstream's clock starts at the flow's start on a running Ray session; ``ray_session_s``
    (the local session this run started, None if it joined one) is added to each of its
    runs as ``docs_per_s_with_ray_session``, the counterpart of Spark's from its JVM's launch."""
    from driftstream.examples.benchmarks.backlog import documents

    from .throughput import run_all, table

    from .bytewax_baseline import bytewax_python
    from .flink_baseline import flink_python

    engines = [e for e in (args.engines or "driftstream,driftstream-arrow,spark,flink,bytewax").split(",") if e]
    finders = {"flink": flink_python, "bytewax": bytewax_python}
    pythons = {e: _python_or_none(console, e, finders[e]) for e in engines if e in finders}
    engines = [e for e in engines if pythons.get(e, "") is not None]
    docs = documents(args.docs)
    console.print(f"[bold]backlog[/] {len(docs):,} documents, engines: {', '.join(engines)}")
    flames = Path(args.flames) if getattr(args, "flames", None) else None
    rows = run_all(docs, engines, bootstrap, workdir, report=lambda r: console.print(json.dumps(r)), pythons=pythons, flames=flames)
    from .throughput import overhead_ratio, plain_loop

    loop = plain_loop(docs)
    for r in rows:
        if "seconds_with_jvm_start" in r:
            # The same yardstick for the JVM engine: its docs/s over the loop's, from its
            # query's start and from its launch (its operators are not Python, so this says
            # how far its pace is from Python's own, not what it pays around Python)
            r["overhead_ratio"] = overhead_ratio(r, loop)
            r["overhead_ratio_from_launch"] = overhead_ratio({"docs_per_s": r["docs"] / r["seconds_with_jvm_start"]}, loop)
            console.print(f"the same yardstick for {r['engine']}: {r['overhead_ratio']} from its query's start, "
                          f"{r['overhead_ratio_from_launch']} from its launch")
        if r["engine"] in finders:  # their clocks start at their launch
            r["overhead_ratio"] = overhead_ratio(r, loop)
            console.print(f"the same yardstick for {r['engine']}: {r['overhead_ratio']} from its launch")
        if r["engine"].startswith("driftstream"):
            r["overhead_ratio"] = overhead_ratio(r, loop)
            console.print(f"engine overhead ratio: {r['engine']} {r['docs_per_s']} docs/s on 2 cores, exactly-once, through "
                          f"Kafka, over the plain loop's {loop['docs_per_s']} docs/s in one thread = {r['overhead_ratio']}")
            if ray_session_s is not None:
                r["ray_session_s"] = round(ray_session_s, 2)
                r["docs_per_s_with_ray_session"] = round(r["docs"] / (r["seconds"] + ray_session_s), 1)
                console.print(f"with the Ray session's start ({r['ray_session_s']} s, once per process): {r['engine']} "
                              f"{r['docs_per_s_with_ray_session']} docs/s")
    rows.append(loop)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=1))
    console.print(table(rows))
    console.print(f"results: {out / 'throughput.json'}")
    return 0 if all(r.get("correct") for r in rows) else 1


def _throughput_files(args: Any, workdir: Path, console: Any, ray_session_s: Optional[float] = None) -> int:
    """``--throughput --basis files``: every engine over the same two JSON-lines files, no broker
    (:mod:`.files_basis`); prints the table (and driftstream's µs per record per step kind with
    ``--profile``) and writes the figures to ``--out``/throughput-files.json."""
    from driftstream.examples.benchmarks.backlog import documents

    from .bytewax_baseline import bytewax_python
    from .files_basis import FILES_ENGINES, files_table, floors, run_all_files, step_kind_costs, step_kind_table
    from .pathway_baseline import pathway_python

    engines = [e for e in (args.engines or ",".join(FILES_ENGINES)).split(",") if e]
    finders = {"bytewax": bytewax_python, "bytewax-no-recovery": bytewax_python, "pathway": pathway_python}
    pythons = {e: _python_or_none(console, e, finders[e]) for e in engines if e in finders}
    engines = [e for e in engines if pythons.get(e, "") is not None]
    docs = documents(args.docs)
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), os.getloadavg()
    console.print(f"[bold]files basis[/] {len(docs):,} documents in 2 files, engines: {', '.join(engines)}")
    profile = Path(args.profile) if getattr(args, "profile", None) else None
    work = workdir / f"files-{int(time.time())}"
    rows = run_all_files(docs, engines, work, pythons={k.split("-")[0]: v for k, v in pythons.items()},
                         report=lambda r: console.print(json.dumps(r)), profile=profile)
    # the load averages say how shared the machine was (the wall clocks of a loaded machine are the others' too)
    results: dict = {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average_before": load_before,
                     "load_average_after": os.getloadavg(), "basis": "files", "docs": len(docs),
                     "command": "driftstream bench inverted-index " + " ".join(getattr(args, "argv", [])),
                     "ray_session_s": None if ray_session_s is None else round(ray_session_s, 2), "rows": rows}
    console.print(files_table(rows))
    results["floors"] = floors(rows)
    for f in results["floors"]:
        console.print(f"floor {f['floor']}: {'met' if f['met'] else 'missed'} ({f['ratio']} by docs/s, {f['ratio_by_cpu']} by CPU)")
    if profile is not None:
        results["step_kinds"] = step_kind_costs(profile, rows)
        console.print(step_kind_table(results["step_kinds"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput-files.json").write_text(json.dumps(results, indent=1))
    console.print(f"results: {out / 'throughput-files.json'}")
    return 0 if all(r.get("correct") for r in rows) else 1


def ab_options(spec: str, workdir: Path) -> tuple:
    """``--ab``'s run options: ``name=value`` pairs, comma-separated, each value JSON (a
    number, null, true) or else a string; ``data_plane_tls=on`` makes throw-away TLS files.

    >>> ab_options("source_alignment=2,batch_size=64", Path("."))
    (('source_alignment', 2), ('batch_size', 64))
    """
    out = []
    for pair in spec.split(","):
        name, _, raw = pair.partition("=")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if name == "data_plane_tls" and value == "on":
            value = _throwaway_tls(workdir / "tls")
        out.append((name, value))
    return tuple(out)


def _throwaway_tls(directory: Path) -> dict:
    """A CA and a node certificate it signs (``openssl``, EC P-256), as data_plane_tls takes them."""
    import subprocess

    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench CA"],
                 ["req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=bench node"],
                 ["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem", "-days", "2"]):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    return {"ca": str(directory / "ca.pem"), "cert": str(directory / "node.pem"), "key": str(directory / "node.key")}


def _ab_report(results: dict, grid: list, base_label: str, out: str, console: Any, name: str) -> int:
    """An A/B's figures (--metrics-ab, --ab): per round, p50 / p99 of each configuration minus
    the first's (the rounds ran interleaved), printed and written to ``out``/``name``.json."""
    results["ab"] = {q: {k: v for k, v in round_differences(results["grid"], base_label, q).items() if k != base_label}
                     for q in ("p50", "p99")}
    for q, diffs in results["ab"].items():
        for label, d in diffs.items():
            console.print(f"{label} minus {base_label}, {q} per round (ms): " + ", ".join(f"{x:+.1f}" for x in d)
                          + f"; median {statistics.median(d):+.1f}")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"results: {path / f'{name}.json'}")
    return 0 if all(r.correct for r in grid) else 1


def main(argv: Optional[list] = None, demo: bool = False) -> int:
    """``driftstream bench inverted-index`` (and ``driftstream demo`` with ``demo=True``)."""
    import argparse
    import platform

    from rich.console import Console

    parser = argparse.ArgumentParser(
        prog="driftstream demo" if demo else "driftstream bench inverted-index",
        description="driftstream exactly-once on the inverted index, checked against the PySpark ground truth"
        if demo else "the inverted-index benchmark: driftstream vs Spark Structured Streaming",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: start a local broker)")
    parser.add_argument("--source", default="ovos", help="corpus: ovos (default), a MediaWiki XML(.bz2) dump or a text dir")
    parser.add_argument("--rate", type=float, default=50.0, help="docs/s (default 50)")
    parser.add_argument("--seconds", type=float, default=60.0 if demo else 40.0, help="feed time per grid run")
    parser.add_argument("--skip", type=int, default=200, help="documents left out of the percentiles")
    parser.add_argument("--out", default="bench-results/inverted-index", help="results directory")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "driftstream-bench"))
    if not demo:
        parser.add_argument("--quick", action="store_true", help="grid only, 20 s per run")
        parser.add_argument("--only", choices=["driftstream", "spark"], help="run one engine's configurations")
        parser.add_argument("--no-ladder", action="store_true", help="skip the rate ladder (the highest rate with p99 < 100 ms)")
        parser.add_argument("--no-recovery", action="store_true")
        parser.add_argument("--standbys", type=int, default=0, help="driftstream's spare actors in the recovery run")
        parser.add_argument("--no-flink", action="store_true",
                            help="leave Flink out (it runs where apache-flink is installed, see flink_baseline.py)")
        parser.add_argument("--rates", default="10,25,50,100,200", help="the rate ladder's steps, docs/s")
        parser.add_argument("--throughput", action="store_true",
                            help="instead of the latency runs: backlog throughput of the engines over --docs documents (throughput.py)")
        parser.add_argument("--docs", type=int, default=10_000,
                            help="documents of the --throughput backlog (default 10,000; the corpus has 26,210)")
        parser.add_argument("--flames", default=None, metavar="DIR",
                            help="--throughput: a py-spy flame graph (SVG) of each of driftstream's actors into DIR")
        parser.add_argument("--engines", default=None,
                            help="engines of the --throughput run: with --basis kafka (default driftstream,driftstream-arrow,"
                            "spark,flink,bytewax; flink and bytewax where installed, see flink_baseline.py and bytewax_baseline.py; "
                            "spark-one-batch: Spark reading the backlog as one micro-batch; driftstream-warm: the flow's "
                            "actors started before its clock, driftstream.engine.warm_up); "
                            "with --basis files (default loop,driftstream,driftstream-p1,bytewax,bytewax-no-recovery,pathway; "
                            "also driftstream-warm, driftstream-p1-warm; "
                            "bytewax and pathway where installed, see files_basis.py)")
        parser.add_argument("--basis", choices=["kafka", "files"], default="kafka",
                            help="--throughput's basis: kafka (the index between two topics of the broker) or files "
                            "(every engine from and to JSON-lines files, no broker; files_basis.py)")
        parser.add_argument("--profile", default=None, metavar="DIR",
                            help="--basis files: py-spy's stacks of driftstream's actors into DIR and a table of the "
                            "engine's µs of CPU per record per step kind")
        parser.add_argument("--rounds", type=int, default=4,
                            help="driftstream grid runs per configuration, interleaved; percentiles pool them (default 4)")
        parser.add_argument("--metrics-ab", action="store_true",
                            help="instead of the grid: exactly-once (1 s snapshots) without and with the Ray metrics export, "
                            "--rounds interleaved rounds (run with RAY_enable_metrics_collection=1)")
        parser.add_argument("--ab", default=None, metavar="OPTION=VALUE[,...]",
                            help="instead of the grid: exactly-once (1 s snapshots) as it is and with these run options, "
                            "--rounds interleaved rounds (e.g. source_alignment=2; data_plane_tls=on makes throw-away TLS files)")
    args = parser.parse_args(argv)
    console = Console()
    seconds = 20.0 if getattr(args, "quick", False) else args.seconds
    docs = int(args.rate * seconds)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    from driftstream.engine.connectors.local_kafka import start_local_kafka
    from driftstream.engine.runtime.ray_session import ensure_ray

    files_basis = getattr(args, "throughput", False) and args.basis == "files"  # no broker: none is started
    broker = None if args.bootstrap or files_basis else start_local_kafka()
    bootstrap = args.bootstrap or (broker.bootstrap_servers if broker is not None else None)
    if bootstrap:
        console.print(f"[bold]broker[/] {bootstrap}" + ("" if args.bootstrap else " (local Tansu)"))
    started_ray = False
    try:
        if getattr(args, "throughput", False):
            began = time.time()
            started_ray = ensure_ray(None)
            if files_basis:
                args.argv = list(argv if argv is not None else sys.argv[1:])
                return _throughput_files(args, workdir, console, ray_session_s=time.time() - began if started_ray else None)
            return _throughput(args, bootstrap, workdir, console, ray_session_s=time.time() - began if started_ray else None)
        rates = [] if demo or args.quick or args.no_ladder else [float(x) for x in args.rates.split(",")]
        n_corpus = max([docs] + [step_docs(r, args.skip) for r in rates])
        corpus, truth = prepare(workdir, n_corpus, args.source, console=console)
        started_ray = ensure_ray(None)
        bench = Benchmark(corpus, bootstrap, truth=truth, skip=args.skip, workdir=str(workdir))
        progress, update, _ = _progress_display(console)
        bench.progress = update
        if demo:
            configs = [Config("driftstream", "exactly-once", 1.0)]
        elif getattr(args, "metrics_ab", False):
            configs = [Config("driftstream", "exactly-once", 1.0, export_metrics=False), Config("driftstream", "exactly-once", 1.0)]
        elif getattr(args, "ab", None):
            configs = [Config("driftstream", "exactly-once", 1.0), Config("driftstream", "exactly-once", 1.0, options=ab_options(args.ab, workdir))]
        else:
            configs = [c for c in GRID if not args.only or c.engine == args.only]
        results: dict = {"rate": args.rate, "docs": docs, "skip": args.skip, "corpus": corpus,
                         "machine": f"{os.cpu_count()} cores, {platform.platform()}", "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        runs: dict = {c.label: [] for c in configs}
        rounds = getattr(args, "rounds", 1)
        with progress:
            for c in rotated_rounds([c for c in configs if c.engine == "driftstream"], rounds):
                runs[c.label].append(bench.run(c, rate=args.rate, docs=docs))
            for c in configs:
                if c.engine != "driftstream":  # seconds of latency: one run says enough
                    runs[c.label].append(bench.run(c, rate=args.rate, docs=docs))
        grid = [pooled(runs[c.label]) for c in configs]
        python = None if demo or args.only or args.no_flink else _flink_python_or_none(console)
        if python:
            with progress:
                grid += flink_latency_runs(bench, args.rate, docs, python)
        results["rounds"] = rounds
        results["grid"] = [slim(r) for r in grid]
        console.print(latency_table(grid, f"document latency at {args.rate:g} docs/s, first {args.skip} skipped"))
        for r in grid:
            for p in r.problems[:5]:
                console.print(f"[red]{r.label}: {p}[/]")
        if getattr(args, "metrics_ab", False):
            return _ab_report(results, grid, configs[0].label, args.out, console, "metrics-ab")
        if getattr(args, "ab", None):
            results["command"] = "driftstream bench inverted-index " + " ".join(argv or sys.argv[1:])
            return _ab_report(results, grid, configs[0].label, args.out, console, "ab-" + args.ab.replace("=", "-").replace(",", "_"))
        if demo:
            ok = all(r.correct for r in grid)
            console.print("[green]output equals the ground truth[/]" if ok else "[red]output differs from the ground truth[/]")
            return 0 if ok else 1
        throughputs = []
        if rates:
            with progress:
                for c in ([Config("driftstream", "exactly-once", 1.0)] if args.only != "spark" else []) + (
                    [Config("spark", trigger="0")] if args.only != "driftstream" else []
                ):
                    throughputs.append(rate_ladder(bench, c, rates))
            results["throughput"] = throughputs
        if not (args.quick or args.no_recovery or args.only == "spark"):
            with progress:
                rec = bench.run(Config("driftstream", "exactly-once", 1.0, standbys=args.standbys), rate=args.rate, docs=docs,
                                kill_at=(seconds * 0.3, seconds * 0.5, seconds * 0.7))
            results["recovery"] = slim(rec, timeline=True)
        results["floors"] = floors(results["grid"], throughputs)
        paths = write_results(results, args.out)
        console.print(Path(paths["markdown"]).read_text())
        console.print(f"results: {', '.join(paths.values())}")
        return 0
    finally:
        if started_ray:
            import ray

            ray.shutdown()
        if broker is not None:
            broker.stop()
