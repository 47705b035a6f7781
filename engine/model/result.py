"""What a run returns: released output per sink, and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from driftstream.ordering.meta import Meta

from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.run_counts import RunCounts


def percentiles(values_ms: list, points: tuple = (50, 75, 95, 99)) -> dict:
    """Nearest-rank percentiles plus max and count.

    >>> percentiles([1.0, 2.0, 3.0, 4.0])
    {'p50': 2.0, 'p75': 3.0, 'p95': 4.0, 'p99': 4.0, 'max': 4.0, 'count': 4}
    """
    if not values_ms:
        return {"count": 0}
    data = sorted(values_ms)
    out: dict = {}
    for p in points:
        rank = max(1, -(-p * len(data) // 100))  # ceil(p/100 * n)
        out[f"p{p}"] = data[rank - 1]
    out["max"] = data[-1]
    out["count"] = len(data)
    return out


@dataclass
class Metrics:
    """Per-step counts and run-level figures.

    ``elements``: elements (tombstones included) each step processed;
    ``tombstones_emitted``: per stateful step; ``tombstones_at_sinks``: tombstones
    a barrier could not match and released (0 in a correct run);
    ``peak_log_entries``: the largest in-memory keyed log seen by any instance;
    ``dead_letters``: records diverted to a dead-letter destination (malformed input
    records, and elements of steps with ``on_error="dead-letter"``);
    ``latency_ms``: source emit -> barrier release percentiles.

    ``released``, ``dead_letters`` and ``step_dead_letters`` count the whole run, over its
    recoveries (an element a recovery replayed that its sink already held counts once);
    ``elements`` and the others, what the last incarnation did.
    """

    elements: dict = field(default_factory=dict)
    tombstones_emitted: dict = field(default_factory=dict)
    #: per stateful step: elements that arrived after an element of their key later in t
    #: (the key's state rolled back and re-applied from them; the output is the same)
    out_of_order: dict = field(default_factory=dict)
    #: per window step: elements that reached a window after it closed (what its late sink got)
    late_elements: dict = field(default_factory=dict)
    tombstones_at_sinks: dict = field(default_factory=dict)
    released: dict = field(default_factory=dict)
    peak_log_entries: int = 0
    dead_letters: int = 0
    #: per step with on_error="dead-letter": the elements it diverted (part of ``dead_letters``)
    step_dead_letters: dict = field(default_factory=dict)
    #: input records an at-most-once recovery skipped (lost by choice, never duplicated)
    skipped: int = 0
    #: snapshots committed (every part durable, then its manifest written)
    snapshots: int = 0
    #: snapshots the store failed (retried with backoff; see RunConfig.snapshot_failure_timeout)
    snapshot_failures: int = 0
    recoveries: int = 0
    #: per instance (``"stage/index"``): how many times it restored from a snapshot after a
    #: failure (the simulator's; under recovery="local" only the failed instances)
    restores: dict = field(default_factory=dict)
    #: replicas > 1 on Ray: dead primaries whose live replica took over, no restore (counted in
    #: ``recoveries`` too, with kind "failover" in ``recovery_s``)
    failovers: int = 0
    #: replicas > 1 on Ray: lost replicas replaced by a new one, restored and caught up while the
    #: others ran on (kind "replica replaced" in ``recovery_s``; not in ``restores``: no instance rolled back)
    replacements: int = 0
    #: per snapshot: seconds from its marker until every part was durable
    snapshot_s: list = field(default_factory=list)
    #: per snapshot: wall times ``(marker sent, every part durable)``
    snapshot_windows: list = field(default_factory=list)
    #: per recovery, as ``status()["recoveries"]``: ``detected_at`` (wall time), seconds from
    #: then to restored actors (``restored_s``, where they went in ``steps_s``, per instance
    #: reset ``resets_s``) and to the first new output (``first_output_s``), and the ``snapshot``
    recovery_s: list = field(default_factory=list)
    #: verify="majority" or "sample:N" (the simulator's): per dissent of an instance's replicas,
    #: ``instance``, ``replicas`` (the dissenters), ``kind``, the epoch's ``t_range``, every voter's
    #: ``digests``, the stage's ``steps``, the ``action`` taken and ``released`` (sample:N: the
    #: epoch's output had left the sinks before the vote; see runtime/simulated_votes.py)
    dissents: list = field(default_factory=list)
    #: verify="reexecute:N" (the simulator's; on Ray the instance's log line): per silent corruption
    #: caught, the ``step``, ``instance``, the batch's ``t_range``, what differed (``found``, with
    #: both digests of each) and the snapshot the run rolled back to (``restored``, its time
    #: ``restored_t``; None: the beginning), see runtime/reexecuted_step.py
    corruptions: list = field(default_factory=list)
    wall_time: float = 0.0
    latency_ms: dict = field(default_factory=dict)
    #: per stateful step backed by a state cache: records and bytes cached (summed over its
    #: instances), each instance's budget, and states evicted, spilled and read back
    state_cache: dict = field(default_factory=dict)
    #: the largest peak resident memory of any instance's process (0: not measured, e.g. the simulator)
    peak_rss_bytes: int = 0
    #: wall time the first input element was read, by any source instance that reported it
    #: (None: none, or the simulator): a backlog's rate without the actors' start
    first_read_at: Optional[float] = None

    def carry(self, counts: RunCounts) -> None:
        """Add what the run's earlier incarnations counted (``released``, the dead letters)
        below the snapshot the last one restored: the figures of the whole run.

        >>> m = Metrics(released={"out": 2}, step_dead_letters={"parse": 1})
        >>> m.carry(RunCounts({"out": 5}, {"parse": 2})); m.released, m.dead_letters
        ({'out': 7}, 3)
        """
        self.released = sum_per_step([self.released, counts.released])
        self.step_dead_letters = sum_per_step([self.step_dead_letters, counts.dead_letters])
        self.dead_letters = sum(self.step_dead_letters.values())

    @property
    def total_tombstones(self) -> int:
        return sum(self.tombstones_emitted.values())

    def summary(self) -> str:
        lines = [f"wall time {self.wall_time:.2f}s" + (f", {self.dead_letters} dead letters" if self.dead_letters else "")]
        for name, n in self.elements.items():
            extra = f", {self.tombstones_emitted[name]} tombstones emitted" if name in self.tombstones_emitted else ""
            lines.append(f"  {name}: {n} elements{extra}")
        if self.latency_ms.get("count"):
            lat = self.latency_ms
            lines.append("  release latency ms: " + ", ".join(f"{k} {lat[k]:.2f}" for k in ("p50", "p75", "p95", "p99", "max")))
        return "\n".join(lines)


@dataclass
class RunResult:
    """Output released to each sink (merged across its partitions in t order) and metrics."""

    outputs: dict
    metrics: Metrics

    def output(self, sink: str) -> list:
        """The payloads released to sink ``sink``, in t order."""
        return [p for _, p in self.output_with_meta(sink)]

    def output_with_meta(self, sink: str) -> list:
        """``(meta, payload)`` pairs released to ``sink``, in t order."""
        if sink not in self.outputs:
            raise FlowError(f"no in-memory sink named {sink!r}; sinks with output: {sorted(self.outputs)}")
        return self.outputs[sink]


def add_cache_stats(total: dict, instance: dict) -> dict:
    """Add one instance's ``{step: StateCache.stats()}`` into ``total`` (the budget is per
    instance: kept, not summed); returns ``total``.

    >>> add_cache_stats({"index": {"records": 2, "bytes": 10, "budget": 64}}, {"index": {"records": 1, "bytes": 5, "budget": 64}})
    {'index': {'records': 3, 'bytes': 15, 'budget': 64}}
    """
    for step, stats in instance.items():
        into = total.setdefault(step, {})
        for name, value in stats.items():
            into[name] = value if name == "budget" else into.get(name, 0) + value
    return total


def sum_per_step(counts: Iterable[dict]) -> dict:
    """``{step: n}`` dicts (one per instance), summed per step.

    >>> sum_per_step([{"a": 1, "b": 2}, {"a": 3}])
    {'a': 4, 'b': 2}
    """
    total: dict = {}
    for per_step in counts:
        for step, n in per_step.items():
            total[step] = total.get(step, 0) + n
    return total


#: Metrics that are ``{step: count}`` per instance, summed over the instances.
PER_STEP_COUNTS = ("elements", "tombstones_emitted", "out_of_order", "late_elements", "step_dead_letters", "tombstones_at_sinks", "released")


@dataclass
class InstanceReport:
    """What a stage instance hands back when its incarnation ends (the Ray actor's
    ``report()``, the simulator's live instances): ``collected``, per in-memory sink its
    ``(meta, payload)`` pairs; ``metrics``, its counters (``StageRuntime.metrics()`` and the
    runtime's: ``state_cache``, ``peak_rss_bytes``, ``first_read_at``); its latency samples
    ``emit_times`` and ``release_times`` (time -> wall clock)."""

    collected: dict
    metrics: dict
    emit_times: dict
    release_times: dict


def merge_instances(reports: Iterable[InstanceReport], wall_time: float, sinks: Optional[list] = None) -> RunResult:
    """Combine the instances' reports into the run's result."""
    outputs: dict = {name: [] for name in (sinks or [])}
    m = Metrics(wall_time=wall_time)
    emit: dict = {}
    release: dict = {}
    reports = list(reports)
    for r in reports:
        for name, elems in r.collected.items():
            outputs.setdefault(name, []).extend(elems)
        im = r.metrics
        m.peak_log_entries = max(m.peak_log_entries, im["peak_log_entries"])
        add_cache_stats(m.state_cache, im.get("state_cache", {}))
        m.peak_rss_bytes = max(m.peak_rss_bytes, im.get("peak_rss_bytes", 0))
        if im.get("first_read_at") is not None:
            m.first_read_at = min(m.first_read_at or im["first_read_at"], im["first_read_at"])
        emit.update(r.emit_times)
        for t, w in r.release_times.items():
            if w > release.get(t, 0.0):
                release[t] = w
    for key in PER_STEP_COUNTS:
        setattr(m, key, sum_per_step(r.metrics.get(key, {}) for r in reports))
    m.dead_letters = sum(m.step_dead_letters.values())
    for name, elems in outputs.items():
        elems.sort(key=lambda e: e[0])
        outputs[name] = [(Meta._make(m), p) for m, p in elems]
    m.latency_ms = percentiles([(w - emit[t]) * 1000.0 for t, w in release.items() if t in emit])
    return RunResult(outputs, m)
