"""driftstream bench cdc: its figures come from a real copy that equals its source."""

from __future__ import annotations

from driftstream.examples.benchmarks.cdc import run


def test_the_cdc_bench_measures_a_copy_that_equals_its_source(ray_session, postgres):
    figures = run(postgres.dsn, backlog=300, rate=50.0, seconds=1.0)
    assert figures["copy_equals_source"] is True
    assert figures["landed"] == figures["updates"] >= 20  # every update measured, once
    assert figures["p50"] > 0 and figures["p99"] < 60_000  # landed after it was written, and not lost for a minute
    assert figures["changes_per_s_first_to_last"] > 0 and figures["backlog_s_from_start"] > 0
