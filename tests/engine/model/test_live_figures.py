"""The live figures of status(): the recent window of release samples, the join with emit
samples across instances, the window's percentiles, and the watermark's lag behind the clock."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.model.live_figures import emit_samples, latencies_ms, recent_samples, watermark_lag_s, window_summary
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.ordering.meta import BOTTOM, TOP


def t(i: int) -> tuple:
    return (i, 0, 0, i)


def test_recent_samples_are_the_newest_since_the_window_start_and_bounded():
    samples = {t(i): 100.0 + i for i in range(50)}
    assert recent_samples(samples, since=145.0) == [(t(i), 100.0 + i) for i in range(49, 44, -1)]
    assert recent_samples(samples, since=0.0, limit=3) == [(t(49), 149.0), (t(48), 148.0), (t(47), 147.0)]
    assert recent_samples(samples, since=200.0) == []
    assert recent_samples({}, since=0.0) == []


def test_emit_samples_answer_only_the_times_asked_and_held():
    held = {t(1): 1.0, t(2): 2.0, t(3): 3.0}
    assert emit_samples(held, [t(2), t(3), t(9)]) == {t(2): 2.0, t(3): 3.0}
    assert emit_samples(held, []) == {}


def test_the_join_takes_the_last_release_and_the_latest_emit_per_time():
    sink_a = [(t(1), 10.0), (t(2), 10.1)]
    sink_b = [(t(1), 10.3)]  # t(1) released by two sinks: it counts once, at its last release
    source = {t(1): 9.9, t(2): 10.0, t(3): 10.0}
    window = {t(2): 10.05}  # a window's result: its latency starts at the close
    got = sorted(round(v, 6) for v in latencies_ms([sink_a, sink_b], [source, window]))
    assert got == [50.0, 400.0]
    assert latencies_ms([[(t(7), 1.0)]], [source]) == []  # no emit sample: left out


def test_window_summary_has_exactly_the_status_keys_or_is_none():
    assert window_summary([]) is None
    s = window_summary([float(v) for v in range(1, 101)])
    assert s == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "count": 100}


class EpochSource(MemorySource):
    epoch_ms_times = True


def _plan(source) -> object:
    flow = Flow("lag")
    flow.source(source, name="in").sink(MemorySink("out"))
    return flow.plan(1)


def test_watermark_lag_only_for_sources_with_wall_clock_times():
    epoch = _plan(EpochSource([1.0], timestamp=float))
    source_id = next(s.id for s in epoch.steps if s.kind.is_source)
    assert watermark_lag_s((1_700_000_000_000, source_id, 0, 5), epoch, now=1_700_000_003.25) == 3.25
    assert watermark_lag_s(BOTTOM, epoch, now=1.0) is None and watermark_lag_s(TOP, epoch, now=1.0) is None
    assert watermark_lag_s(None, epoch, now=1.0) is None
    indexes = _plan(MemorySource([1.0]))  # ts is an index, not a time: no lag
    assert watermark_lag_s((5, source_id, 0, 5), indexes, now=1_700_000_003.0) is None


def test_an_instance_tells_its_counters_and_only_the_samples_asked_for():
    """instance_stats over a real StageRuntime: the counts per step, and the release and
    emit samples only when a status call asks for them."""
    from driftstream.engine.model.live_figures import instance_stats
    from driftstream.engine.runtime.stage import StageRuntime
    from driftstream.ordering.meta import Meta

    flow = Flow("stats")
    flow.source(MemorySource([]), name="s").map(str.upper, name="up").sink(MemorySink("out"))
    rt = StageRuntime(flow.plan(1), stage_index=0, instance=0, seed=1)
    rt.process_source([(Meta(i, 0, 0, i), "x") for i in range(3)])
    rt.on_watermark((3,))
    quiet = instance_stats(rt, None, {"records": 0})
    assert quiet["releases"] == [] and quiet["emits"] == {} and quiet["source_lag"] is None
    assert quiet["elements"] and max(quiet["elements"].values()) == 3 and quiet["state_cache"] == {"records": 0}
    asked = instance_stats(rt, None, {}, releases_since=0.0, emits_of=list(rt.emit_times))
    assert asked["releases"] and asked["emits"] == dict(rt.emit_times)
