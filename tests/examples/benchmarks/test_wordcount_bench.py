"""Word-count benchmarks on the Ray runtime (figures, not asserts on time).

Floors from the engine-core issue: >= 50,000 words/s sustained; at 1,000 words/s,
release latency p50 <= 10 ms and p99 <= 30 ms. Printed and stored in
pytest-benchmark's extra_info; `driftstream bench wordcount` prints the same.
"""

from __future__ import annotations

import pytest

from driftstream.examples.benchmarks import bench

pytestmark = pytest.mark.ray


def test_wordcount_throughput(ray_session, benchmark):
    figures = benchmark.pedantic(bench.throughput, kwargs={"lines": 10_000}, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print(f"\nword count: {figures['words_per_s']:,.0f} words/s ({figures['words']:,} words, {figures['tombstones']:,} tombstones)")
    assert figures["words"] == 100_000  # every word was counted


def test_wordcount_release_latency_at_1000_words_per_s(ray_session, benchmark):
    figures = benchmark.pedantic(bench.latency, kwargs={"words_per_s": 1_000, "seconds": 2.0}, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print("\nrelease latency at 1,000 words/s: " + ", ".join(f"{k} {figures[k]:.2f} ms" for k in ("p50", "p75", "p95", "p99", "max")))
    assert figures["count"] == 200  # every line was released and measured
