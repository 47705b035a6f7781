"""The engine's figures on Ray's metrics API, for Ray's Prometheus endpoint and dashboard.

A thread in the coordinator actor asks :meth:`RaySupervisor.live_status` once every
``metrics_interval`` seconds and records what it says as ``ray.util.metrics`` counters,
gauges and a histogram, tagged with the flow (and the step where there is one). Nothing
is added to the data path: the stage actors answer the same two ``stats()`` calls a
``status()`` costs, once per interval. When Ray's metrics collection is off
(``RAY_enable_metrics_collection=0``, driftstream's lean default) no thread starts.

In Prometheus Ray prefixes each name with ``ray_``, and counters end in ``_total``:

==========================================  =========  ================================================
metric (``ray_`` + ...)                     tags       what
==========================================  =========  ================================================
``driftstream_step_elements_total``         flow,step  elements each step processed (replays included)
``driftstream_step_tombstones_total``       flow,step  tombstones each stateful step emitted
``driftstream_step_dead_letters_total``     flow,step  elements a step diverted (``on_error="dead-letter"``)
``driftstream_dead_letters_total``          flow       every dead letter, malformed source records too
``driftstream_emitted_total``               flow       elements the sources emitted
``driftstream_released_total``              flow       elements released to sinks
``driftstream_snapshots_total``             flow       snapshots committed
``driftstream_snapshot_failures_total``     flow       snapshots the store failed
``driftstream_recoveries_total``            flow       recoveries from lost actors
``driftstream_release_latency_ms``          flow       histogram: source emit -> sink release, sampled
``driftstream_release_latency_window_ms``   flow,q     p50 / p95 / p99 over the last interval
``driftstream_watermark_lag_seconds``       flow       now - the watermark's timestamp (Kafka sources)
``driftstream_source_lag_records``          flow       records in the sources not read yet
``driftstream_in_flight``                   flow       times emitted and not yet settled
``driftstream_snapshot_duration_seconds``   flow       the last committed snapshot's duration
``driftstream_snapshot_age_seconds``        flow       seconds since the last snapshot was committed
``driftstream_unavailable_actors``          flow       actors that did not answer (a recovery runs)
==========================================  =========  ================================================

Counters go up by the change since the previous tick. A recovery restarts every
instance's counts of elements and emits: after one the new counts are added whole (what
was processed between the last tick and the failure is not counted; the replay is).
``released``, the dead letters and the snapshots count the whole run
(:data:`WHOLE_RUN`): a recovery does not restart them, and the dip while a replay
settles again what the sinks held is not counted twice.

>>> exporter = start_export("clicks", RunConfig(), supervisor.live_status, launched)   # doctest: +SKIP
>>> exporter.stop()                                                                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, Optional

from driftstream.engine.model.config import RunConfig

log = logging.getLogger(__name__)

PREFIX = "driftstream_"

#: Release latency histogram buckets, in ms.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000)

#: Latency samples one tick observes at most (evenly spread over the tick's samples).
MAX_OBSERVED_PER_TICK = 2_000

#: Counters of the flow: ``status()`` key -> (metric name, description). Instance counts
#: (reset by a recovery) first; the supervisor's own never go back.
FLOW_COUNTERS = {
    "emitted": ("emitted", "elements the sources emitted"),
    "released": ("released", "elements released to sinks"),
    "dead_letters": ("dead_letters", "dead letters: malformed source records and elements steps diverted"),
    "snapshots": ("snapshots", "snapshots committed"),
    "snapshot_failures": ("snapshot_failures", "snapshots the store failed"),
}

#: Counters whose status figures count the whole run, across recoveries (see :mod:`..model.run_counts`).
WHOLE_RUN = frozenset({"released", "dead_letters", "step_dead_letters", "snapshots", "snapshot_failures"})

#: Counters per step: ``status()["steps"]`` key -> (metric name, description).
STEP_COUNTERS = {
    "elements": ("step_elements", "elements the step processed, tombstones and replays included"),
    "tombstones": ("step_tombstones", "tombstones the stateful step emitted"),
}


def collection_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Ray collects metrics in this process (its workers inherit the raylet's
    environment, where ``ray start`` or ``ray.init`` set the switch).

    >>> collection_enabled({"RAY_enable_metrics_collection": "0"}), collection_enabled({})
    (False, True)
    """
    return environ.get("RAY_enable_metrics_collection", "1").strip().lower() not in ("0", "false")


class RayMetrics:
    """The ``ray.util.metrics`` objects, one of each per process."""

    _instance: Optional["RayMetrics"] = None

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        flow, step = ("flow",), ("flow", "step")
        self.counters = {name: Counter(PREFIX + name, desc, flow) for name, desc in FLOW_COUNTERS.values()}
        self.counters["recoveries"] = Counter(PREFIX + "recoveries", "recoveries from lost actors", flow)
        self.counters.update({name: Counter(PREFIX + name, desc, step) for name, desc in STEP_COUNTERS.values()})
        self.counters["step_dead_letters"] = Counter(PREFIX + "step_dead_letters", "elements the step diverted as dead letters", step)
        gauge = {
            "watermark_lag_seconds": "seconds between now and the watermark's timestamp (sources with wall-clock times)",
            "source_lag_records": "records the sources hold beyond what was read",
            "in_flight": "times emitted and not yet below the watermark",
            "snapshot_duration_seconds": "the last committed snapshot: from its marker until every part was durable",
            "snapshot_age_seconds": "seconds since the last snapshot was committed",
            "unavailable_actors": "actors that did not answer the last status call (dead, being replaced)",
        }
        self.gauges = {name: Gauge(PREFIX + name, desc, flow) for name, desc in gauge.items()}
        self.gauges["release_latency_window_ms"] = Gauge(
            PREFIX + "release_latency_window_ms", "release latency percentiles over the last export interval", ("flow", "quantile"))
        self.latency = Histogram(PREFIX + "release_latency_ms", "release latency (source emit -> sink release), a sample of the elements",
                                 list(LATENCY_BUCKETS_MS), flow)

    @classmethod
    def shared(cls) -> "RayMetrics":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance


class Recorder:
    """Records successive ``live_status()`` answers of one flow into metric objects (Ray's
    or any with their ``inc`` / ``set`` / ``observe``): counters by deltas, gauges as they are."""

    def __init__(self, flow: str, metrics) -> None:
        self.flow = flow
        self.metrics = metrics
        self.last: dict = {}  # (counter, step or None) -> the value recorded last
        self.recoveries = 0

    def record(self, status: dict) -> None:
        m, tags = self.metrics, {"flow": self.flow}
        recovered = len(status["recoveries"]) != self.recoveries
        if recovered:
            m.counters["recoveries"].inc(len(status["recoveries"]) - self.recoveries, tags)
            self.recoveries = len(status["recoveries"])
        # With actors missing the sums are partial: counting them would count twice later.
        if not status["unavailable"]:
            for key, (name, _) in FLOW_COUNTERS.items():
                self._count(name, None, status[key], recovered)
            for step, figures in status["steps"].items():
                for key, (name, _) in STEP_COUNTERS.items():
                    self._count(name, step, figures[key], recovered)
            for step, n in status["step_dead_letters"].items():
                self._count("step_dead_letters", step, n, recovered)
        last = status["last_snapshot"]
        gauges = {
            "watermark_lag_seconds": status["watermark_lag_s"],
            "source_lag_records": status["source_lag"],
            "in_flight": status["in_flight"],
            "snapshot_duration_seconds": None if last is None else last["duration_s"],
            "snapshot_age_seconds": None if last is None else last["age_s"],
            "unavailable_actors": status["unavailable"],
        }
        for name, value in gauges.items():
            if value is not None:
                m.gauges[name].set(value, tags)
        window = status["latency_ms"]
        if window is not None:
            for q in ("p50", "p95", "p99"):
                m.gauges["release_latency_window_ms"].set(window[q], {"flow": self.flow, "quantile": q})
        samples = status.get("latency_samples_ms") or []
        stride = -(-len(samples) // MAX_OBSERVED_PER_TICK)
        for value in samples[::stride] if samples else ():
            m.latency.observe(value, tags)

    def _count(self, name: str, step: Optional[str], value: int, restarted: bool) -> None:
        """Add ``value``'s change since the last tick; the whole of it after a restart (a
        recovery, or a value below the last: the counts began again). A whole-run count
        never restarts: only what passes the highest value seen is added."""
        key = (name, step)
        before = self.last.get(key, 0)
        if name in WHOLE_RUN:
            delta, self.last[key] = value - before, max(before, value)
        else:
            delta = value if restarted or value < before else value - before
            self.last[key] = value
        if delta > 0:
            self.metrics.counters[name].inc(delta, {"flow": self.flow} if step is None else {"flow": self.flow, "step": step})


class MetricsExporter:
    """A daemon thread: once ``ready`` is set, every ``interval`` seconds, one
    ``live_status(latency_since=<the previous tick>, latency_samples=True)`` recorded."""

    def __init__(self, flow: str, live_status: Callable[..., dict], interval: float, ready: threading.Event, metrics=None) -> None:
        self.recorder = Recorder(flow, metrics or RayMetrics.shared())
        self.live_status = live_status
        self.interval = interval
        self.ready = ready
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"driftstream-metrics-{flow}", daemon=True)

    def start(self) -> "MetricsExporter":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.ready.set()  # a run that failed before its launch never set it
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=30)

    def _loop(self) -> None:
        self.ready.wait()
        since = time.time()
        while not self.stopped.wait(self.interval):
            now = time.time()
            try:
                self.recorder.record(self.live_status(latency_since=since, latency_samples=True))
            except Exception:  # figures must never stop a run
                log.warning("metrics export of %s failed", self.recorder.flow, exc_info=True)
            since = now


def start_export(flow: str, config: RunConfig, live_status: Callable[..., dict], ready: threading.Event) -> Optional[MetricsExporter]:
    """The run's exporter, started; None when ``config.export_metrics`` is off or Ray does not
    collect metrics here (then it would cost status calls for nothing)."""
    if not config.export_metrics or not collection_enabled():
        return None
    return MetricsExporter(flow, live_status, config.metrics_interval, ready).start()
