"""The engine's figures on Ray's metrics API: what each status answer records (counters by
deltas, across a recovery's restart of the counts; gauges; a bounded latency sample), and a
flow on a Ray cluster with metrics collection on whose figures a Prometheus scrape finds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from driftstream.engine.control.metrics_export import MAX_OBSERVED_PER_TICK, MetricsExporter, Recorder, collection_enabled, start_export
from driftstream.engine.model.config import RunConfig

from tests.engine.control.metrics_flow import NAME, RATE
from tests.ray_head import RayHead

ROOT = Path(__file__).resolve().parents[3]


class Metric:
    """Stands in for a ray.util.metrics object: notes every value recorded, with its tags."""

    def __init__(self) -> None:
        self.calls: list = []

    def inc(self, value, tags):
        assert value > 0  # Ray's Counter refuses anything else
        self.calls.append((value, dict(tags)))

    def set(self, value, tags):
        self.calls.append((value, dict(tags)))

    observe = set

    def total(self, **tags) -> float:
        return sum(v for v, t in self.calls if t == {"flow": "f", **tags})

    def last(self, **tags):
        return [v for v, t in self.calls if t == {"flow": "f", **tags}][-1]


class FakeMetrics:
    def __init__(self) -> None:
        self.counters = defaultdict(Metric)
        self.gauges = defaultdict(Metric)
        self.latency = Metric()


def status(elements: int, recoveries: int = 0, unavailable: int = 0, snapshots: int = 0, samples: tuple = ()) -> dict:
    return {
        "steps": {"in": {"elements": elements, "tombstones": 0}, "count": {"elements": elements, "tombstones": elements // 10}},
        "emitted": elements, "released": elements, "dead_letters": 1, "step_dead_letters": {"check": 1},
        "snapshots": snapshots, "snapshot_failures": 0, "recoveries": [{}] * recoveries, "unavailable": unavailable,
        "watermark_lag_s": 1.5, "source_lag": None, "in_flight": 7,
        "last_snapshot": {"id": snapshots, "t": (1, 0, 0, 1), "duration_s": 0.02, "age_s": 0.4} if snapshots else None,
        "latency_ms": {"p50": 10.0, "p95": 20.0, "p99": 30.0, "count": len(samples)} if samples else None,
        "latency_samples_ms": list(samples),
    }


def test_counters_add_the_change_since_the_last_tick():
    m = FakeMetrics()
    rec = Recorder("f", m)
    for n in (100, 250, 250, 400):
        rec.record(status(n, snapshots=n // 100))
    assert m.counters["step_elements"].total(step="in") == 400
    assert m.counters["step_tombstones"].total(step="count") == 40
    assert m.counters["released"].total() == 400 and m.counters["snapshots"].total() == 4
    assert m.counters["dead_letters"].total() == 1 and m.counters["step_dead_letters"].total(step="check") == 1
    assert m.gauges["in_flight"].last() == 7 and m.gauges["watermark_lag_seconds"].last() == 1.5
    assert m.gauges["snapshot_age_seconds"].last() == 0.4
    assert "source_lag_records" not in m.gauges  # unknown: not set


def test_a_recovery_restarts_the_counts_and_a_partial_answer_counts_nothing():
    m = FakeMetrics()
    rec = Recorder("f", m)
    rec.record(status(1000, snapshots=3))
    rec.record(status(600, unavailable=2, snapshots=3))  # actors missing: sums are partial
    assert m.counters["step_elements"].total(step="in") == 1000
    assert m.gauges["unavailable_actors"].last() == 2
    # After the recovery every instance counts from 0 again; 1,200 is past the last 1,000 but
    # is all new (replay included), not 200 more.
    rec.record(status(1200, recoveries=1, snapshots=4))
    assert m.counters["step_elements"].total(step="in") == 2200
    assert m.counters["recoveries"].total() == 1
    assert m.counters["snapshots"].total() == 4  # the supervisor's own count never restarts


def test_latency_is_observed_as_a_bounded_even_sample_and_its_window_as_gauges():
    m = FakeMetrics()
    rec = Recorder("f", m)
    rec.record(status(10, samples=tuple(float(i) for i in range(3 * MAX_OBSERVED_PER_TICK))))
    observed = [v for v, _ in m.latency.calls]
    assert len(observed) == MAX_OBSERVED_PER_TICK and observed[:2] == [0.0, 3.0]
    assert m.gauges["release_latency_window_ms"].last(quantile="p99") == 30.0


def test_the_exporter_records_every_interval_once_launched_and_stops():
    calls, ready = [], threading.Event()

    def live_status(latency_since, latency_samples):
        calls.append(latency_since)
        return status(len(calls) * 10)

    exporter = MetricsExporter("f", live_status, 0.05, ready, metrics=FakeMetrics()).start()
    time.sleep(0.2)
    assert calls == []  # not before the run's actors are up
    ready.set()
    deadline = time.time() + 10
    while len(calls) < 3:
        assert time.time() < deadline
        time.sleep(0.01)
    exporter.stop()
    assert not exporter.thread.is_alive()
    assert calls == sorted(calls)  # each tick asks for the latency since the previous one


def test_no_export_without_ray_metrics_collection(monkeypatch):
    monkeypatch.setenv("RAY_enable_metrics_collection", "0")
    assert not collection_enabled()
    assert start_export("f", RunConfig(), lambda **kw: {}, threading.Event()) is None
    monkeypatch.setenv("RAY_enable_metrics_collection", "1")
    assert start_export("f", RunConfig(export_metrics=False), lambda **kw: {}, threading.Event()) is None


def _scrape(url: str) -> dict:
    """``{(sample name, frozenset of labels): value}`` of the driftstream metrics of ``NAME``
    (none while the endpoint is not up yet: Ray's metrics agent starts after the head)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "driftstream_" in s.name and s.labels.get("flow") == NAME:
                labels = frozenset((k, v) for k, v in s.labels.items() if k in ("step", "quantile", "le"))
                out[(s.name, labels)] = s.value
    return out


def _value(samples: dict, name: str, **labels):
    return samples.get((name, frozenset(labels.items())))


WANTED = [
    ("ray_driftstream_step_elements_total", {"step": "readings"}),
    ("ray_driftstream_step_elements_total", {"step": "pairs"}),
    ("ray_driftstream_step_dead_letters_total", {"step": "checked"}),
    ("ray_driftstream_dead_letters_total", {}),
    ("ray_driftstream_emitted_total", {}),
    ("ray_driftstream_released_total", {}),
    ("ray_driftstream_snapshots_total", {}),
    ("ray_driftstream_snapshot_duration_seconds", {}),
    ("ray_driftstream_snapshot_age_seconds", {}),
    ("ray_driftstream_watermark_lag_seconds", {}),
    ("ray_driftstream_in_flight", {}),
    ("ray_driftstream_release_latency_window_ms", {"quantile": "p50"}),
    ("ray_driftstream_release_latency_ms_count", {}),
]


@pytest.mark.ray
def test_a_flow_on_a_cluster_shows_its_figures_on_the_prometheus_endpoint(tmp_path):
    with RayHead(metrics=True) as head:
        driver = subprocess.Popen([sys.executable, "-m", "tests.engine.control.metrics_flow", str(tmp_path / "snaps")],
                                  cwd=ROOT, env=head.env, stdin=subprocess.PIPE, start_new_session=True)
        try:
            deadline, samples = time.time() + 45, {}
            while not all(_value(samples, name, **labels) is not None for name, labels in WANTED):
                assert driver.poll() is None, "the driver ended before its metrics were seen"
                missing = [w for w in WANTED if _value(samples, w[0], **w[1]) is None]
                assert time.time() < deadline, f"not on the Prometheus endpoint within 45 s: {missing}"
                time.sleep(0.5)
                samples = _scrape(head.metrics_url)
            v = lambda name, **labels: _value(samples, name, **labels)  # noqa: E731
            # A tick's figures are the actors' answers to one status call, a moment apart: a
            # sink may answer after a source, with a batch more released than the source had
            # read when it answered (52 read, 53 released, once). Within a second of input:
            assert v("ray_driftstream_step_elements_total", step="readings") + RATE >= v("ray_driftstream_released_total") > 0
            assert v("ray_driftstream_emitted_total") + RATE >= v("ray_driftstream_step_elements_total", step="pairs") > 0
            # every 50th input is poison: its dead letter, counted at its step and in the total
            assert v("ray_driftstream_step_dead_letters_total", step="checked") == v("ray_driftstream_dead_letters_total") >= 1
            assert v("ray_driftstream_snapshots_total") >= 1
            assert 0 < v("ray_driftstream_snapshot_duration_seconds") < 10 and 0 <= v("ray_driftstream_snapshot_age_seconds") < 10
            assert 0 <= v("ray_driftstream_watermark_lag_seconds") < 60
            assert 0 < v("ray_driftstream_release_latency_window_ms", quantile="p50") < 5_000
            assert v("ray_driftstream_release_latency_ms_count") > 0
            assert v("ray_driftstream_release_latency_ms_bucket", le="+Inf") == v("ray_driftstream_release_latency_ms_count")
            driver.stdin.close()
            assert driver.wait(timeout=60) == 0
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()


def test_whole_run_counts_are_not_restarted_by_a_recovery_nor_counted_twice_after_its_dip():
    # released and the dead letters count the whole run: after a recovery they dip while the
    # replay settles again what the sinks held, then go on from where they were.
    m = FakeMetrics()
    rec = Recorder("f", m)
    rec.record(status(1000))
    dipped = dict(status(1000, recoveries=1), released=900, dead_letters=1)
    rec.record(dipped)
    rec.record(dict(status(1000, recoveries=1), released=1200, dead_letters=2, step_dead_letters={"check": 2}))
    assert m.counters["released"].total() == 1200
    assert m.counters["dead_letters"].total() == 2 and m.counters["step_dead_letters"].total(step="check") == 2
