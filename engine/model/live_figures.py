"""Figures ``status()`` derives while a flow runs: release latency over a recent window, and
how far the watermark is behind the wall clock.

Release latency (source emit -> sink release, as ``metrics.latency_ms`` at the end of a
run) joins samples that live in different actors: a source instance notes when it
emitted each sampled time, a sink instance when its bundle holding that time was
acknowledged (``StageRuntime.emit_times`` / ``release_times``: time -> wall clock, in
insertion order, so the newest are last). A status call takes from each sink instance
its release samples of the last :data:`LATENCY_WINDOW_S` seconds (newest first, at most
:data:`RECENT_LIMIT`), asks the instances that stamp emit times for those times only,
and joins them. Nothing is added per element: the samples are the ones the end-of-run
figures use; a call costs O(window samples).

>>> releases = {(0, 0, 0, 1): 10.0, (0, 0, 0, 2): 10.5, (0, 0, 0, 3): 11.0}
>>> recent = recent_samples(releases, since=10.2)
>>> recent
[((0, 0, 0, 3), 11.0), ((0, 0, 0, 2), 10.5)]
>>> emits = emit_samples({(0, 0, 0, 2): 10.25, (0, 0, 0, 3): 10.5}, [t for t, _ in recent])
>>> window_summary(latencies_ms([recent], [emits]))
{'p50': 250.0, 'p95': 500.0, 'p99': 500.0, 'count': 2}
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from driftstream.engine.model.result import percentiles

#: Seconds of releases the latency figures of ``status()`` cover.
LATENCY_WINDOW_S = 10.0

#: Release samples one sink instance hands over per status call, the newest: bounds a
#: call's cost when a sink releases thousands of sampled elements per second.
RECENT_LIMIT = 1000


def recent_samples(samples: dict, since: float, limit: int = RECENT_LIMIT) -> list:
    """``(time, wall)`` of the samples noted at or after ``since``, newest first, at most
    ``limit``. ``samples`` is in insertion order (a dict); a time noted again keeps its
    first place, so the scan may stop a little early: an approximation, never a cost."""
    out: list = []
    for t in reversed(samples):
        wall = samples[t]
        if wall < since or len(out) >= limit:
            break
        out.append((t, wall))
    return out


def emit_samples(samples: dict, times: Iterable) -> dict:
    """The emit samples of ``times`` this instance holds (O(len(times)))."""
    return {t: samples[t] for t in times if t in samples}


def instance_stats(rt: Any, reader: Any, cache_stats: dict, releases_since: Optional[float] = None,
                   emits_of: Optional[list] = None) -> dict:
    """What a stage instance (its ``StageRuntime``, its source ``reader`` or None) tells a
    status call: its counters; with ``releases_since``, the release samples noted since then
    (:func:`recent_samples`), and with ``emits_of``, the emit samples of those times. O(steps
    + samples)."""
    return {
        "elements": dict(rt.counts),
        "tombstones": rt.tombstones_emitted(),
        "out_of_order": rt.out_of_order(),
        "releases": [] if releases_since is None else recent_samples(rt.release_times, releases_since),
        "emits": emit_samples(rt.emit_times, emits_of) if emits_of else {},
        "emitted": 0 if reader is None else reader.emitted,
        "source_lag": None if reader is None else reader.lag(),
        "source_partitions": [] if reader is None else reader.fetch_states(),
        # released, or dropped as replayed output the sink held: each element the sinks hold once
        "released": sum(rt.sinks.settled().released.values()),
        "state_cache": cache_stats,
        "late_elements": rt.late_elements(),
        "step_dead_letters": dict(rt.dead_letters),
    }


def latencies_ms(releases: Iterable[list], emits: Iterable[dict]) -> list:
    """Release minus emit, in ms, per time found on both sides. A time released by several
    sinks counts once, at its last release (as ``merge_instances``); a time with several
    emit samples (a window's result: the window's close, after its inputs' emits) takes
    the latest."""
    released: dict = {}
    for pairs in releases:
        for t, wall in pairs:
            if wall > released.get(t, 0.0):
                released[t] = wall
    emitted: dict = {}
    for found in emits:
        for t, wall in found.items():
            if t not in emitted or wall > emitted[t]:
                emitted[t] = wall
    return [(wall - emitted[t]) * 1000.0 for t, wall in released.items() if t in emitted]


def window_summary(values_ms: list) -> Optional[dict]:
    """``{"p50", "p95", "p99", "count"}`` (nearest rank, ms) of a window's latencies; None without any."""
    if not values_ms:
        return None
    p = percentiles(values_ms, (50, 95, 99))
    return {"p50": p["p50"], "p95": p["p95"], "p99": p["p99"], "count": p["count"]}


def watermark_lag_s(watermark: Optional[tuple], plan, now: float) -> Optional[float]:
    """Seconds between ``now`` and the watermark's timestamp, when the source the watermark
    sits on stamps wall-clock times (``Source.epoch_ms_times``: Kafka record timestamps);
    None otherwise, before any watermark and at the end (TOP). Everything below the
    watermark is settled: the lag is how old the newest input is whose output (and all
    before it) is final; it grows when reading falls behind or when processing does.

    >>> from types import SimpleNamespace as NS
    >>> plan = NS(steps=[NS(source=NS(epoch_ms_times=True))])
    >>> watermark_lag_s((1_000_000, 0, 0, 7), plan, now=1_002.5)
    2.5
    >>> watermark_lag_s((float("inf"),), plan, now=1_002.5) is None
    True
    """
    if watermark is None or len(watermark) < 4:
        return None
    source = plan.steps[watermark[1]].source
    if not getattr(source, "epoch_ms_times", False):
        return None
    return round(now - watermark[0] / 1000.0, 3)
