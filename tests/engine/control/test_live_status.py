"""status() of a running flow on Ray: per-step element and tombstone counts, release latency
over the recent window, and the watermark's lag behind the wall clock."""

from __future__ import annotations

import time
import uuid

import pytest

from driftstream.engine import FileSink, Flow
from driftstream.engine.connectors.file_sink import read_file_sink
from driftstream.engine.connectors.memory import _PacedPartition
from driftstream.engine.testing import MemorySink, PacedSource

from tests.engine.control.metrics_flow import POISON, RATE, build
from tests.status_wait import kill_after, wait_for_status

pytestmark = pytest.mark.ray


def test_status_reports_steps_latency_and_watermark_lag(ray_session, tmp_path):
    # Chaos delays batches at random: elements reach the stateful step out of order, which
    # re-applies its keys and takes back outputs with tombstones.
    flow = build("live-status")
    # Its own snapshot_dir: the stop's final snapshot would refuse the next session's start in the default one.
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.5, chaos=0.05, snapshot_dir=str(tmp_path / "snaps"))
    try:
        status = wait_for_status(lambda s: s["released"] > 500 and s["latency_ms"] is not None and s["steps"]["pairs"]["tombstones"] > 0,
                                 handle, "output, latency samples and tombstones")
        steps = status["steps"]
        assert set(steps) == {s.name for s in flow.plan(2).steps}
        # Stateful steps count their out-of-order arrivals too; the others count elements only.
        assert all(set(v) == ({"elements", "tombstones", "out_of_order"} if name == "pairs" else {"elements", "tombstones"})
                   for name, v in steps.items())
        assert 0 < steps["pairs"]["out_of_order"] <= steps["pairs"]["elements"]  # chaos delays batches
        assert all(v["tombstones"] == 0 for name, v in steps.items() if name != "pairs")  # the one stateful step
        # Counts are read in one round per actor, sinks' before sources' (emitted comes later).
        assert 0 < steps["readings"]["elements"] <= status["emitted"]
        assert steps["out"]["elements"] + steps["dlq"]["elements"] >= status["released"]  # both sinks
        assert steps["dlq"]["elements"] == status["dead_letters"] >= steps["readings"]["elements"] // POISON - 2
        lat = status["latency_ms"]
        assert set(lat) == {"p50", "p95", "p99", "count"}
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] < 5_000
        # Every element is sampled (sample_every=1), each once. No bound by the rate: a paced
        # source that fell behind (a loaded machine: 1,616 in one CI run) releases its backlog
        # at once. The window's cut by release time is test_live_figures' (recent_samples).
        assert 0 < lat["count"] <= status["released"]
        # The watermark's ts is the input's own wall-clock time, in ms.
        lag, now = status["watermark_lag_s"], time.time()
        assert lag is not None and abs(lag - (now - status["watermark"][0] / 1000)) < 2.0
        assert "latency_samples_ms" not in status
    finally:
        result = handle.stop(timeout=60)
    # The live counts were a prefix of the run's.
    assert result.metrics.elements["readings"] >= steps["readings"]["elements"]
    assert result.metrics.tombstones_emitted["pairs"] >= steps["pairs"]["tombstones"]
    # The window and the whole run measure the same pipeline at a steady rate.
    assert abs(lat["p50"] - result.metrics.latency_ms["p50"]) < max(50.0, result.metrics.latency_ms["p50"])


def test_status_without_wall_clock_times_has_no_watermark_lag(ray_session):
    flow = Flow("live-status-indexes")
    flow.source(PacedSource(list(range(100_000)), rate=RATE), name="n").sink(MemorySink("out"))
    handle = flow.start(parallelism=1)
    try:
        status = wait_for_status(lambda s: s["released"] > 50 and s["latency_ms"] is not None, handle, "output and latency samples")
        assert status["watermark_lag_s"] is None
        assert status["steps"]["n"]["elements"] > 0 and status["steps"]["n"]["tombstones"] == 0
    finally:
        handle.stop(timeout=60)


class _HeldOpenPartition(_PacedPartition):
    """A paced partition that stays open once read to its end, as a Kafka partition does."""

    def read(self, max_items: int) -> list:
        out = super().read(max_items)
        self.done = False
        return out


class HeldOpenSource(PacedSource):
    """PacedSource whose run does not end with its input: status can be read at rest."""

    def open(self, partition: int, source_id: int, start=None):
        return _HeldOpenPartition(self.items, partition, self._partitions, source_id, self.rate, start, self.timestamp)


def _checked(x: int) -> int:
    if x % 97 == 0:
        raise ValueError(f"poison {x}")
    return x


def _running_sum(state, x):
    s = (state or 0) + x
    return s, s


def test_released_and_dead_letters_count_the_whole_run_across_recoveries(ray_session, tmp_path):
    # Two kills: the source's instance (which holds the dead-letter sink's partition) and a
    # keyed instance with the output sink's. Before, each recovery started the killed
    # instances' counts at 0: status and the result showed a part of what the sinks held.
    n = 6_000
    poison = len(range(0, n, 97))
    name = f"run-counts-{uuid.uuid4().hex[:6]}"
    flow = Flow(name).dead_letters(FileSink(tmp_path / "dlq", name="dlq"))
    (flow.source(HeldOpenSource(list(range(n)), rate=1_000, partitions=2), name="src")
     .map(_checked, name="checked", on_error="dead-letter")
     .key_by(lambda x: x % 7, name="k").stateful_map(_running_sum, name="sum").sink(FileSink(tmp_path / "out", name="sums")))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    held = lambda: (len(read_file_sink(tmp_path / "out", "sums")), len(read_file_sink(tmp_path / "dlq", "dlq")))  # noqa: E731
    try:
        kill_after(handle, f"{name}/src/0", 1_500)
        kill_after(handle, f"{name}/k/1", 3_500)
        wait_for_status(lambda s: held() == (n - poison, poison), handle, "every element in the sinks once")
        status = wait_for_status(lambda s: s["released"] == n, handle, "released to count every element the sinks hold", timeout=10)
        assert len(status["recoveries"]) == 2 and status["counted_since_snapshot"] is None
        assert status["dead_letters"] == poison and status["step_dead_letters"] == {"checked": poison}
    finally:
        result = handle.stop(timeout=60)
    m = result.metrics
    assert held() == (n - poison, poison)  # exactly once: the counts are the sinks' contents
    assert m.recoveries == 2 and m.released == {"sums": n - poison, "dlq": poison}
    assert m.dead_letters == poison and m.step_dead_letters == {"checked": poison}
