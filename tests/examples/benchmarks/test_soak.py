"""The soak past the point where a Kafka flow used to stall (issue: a source that stops
reading after ~90 s at 1,000 records/s on the local broker).

Tansu lists every batch of a partition on each fetch and gives up at the fetch's
``max_wait_ms``: with the reader's fixed 5 ms wait, fetches came back empty for good
once a partition held ~10k batches. With ``linger_ms=0`` the producer makes a batch of
nearly every record; all of them in one partition, that point comes after ~10 s here,
and the run goes on to 14 s.
"""

from __future__ import annotations

import pytest

from driftstream.examples.benchmarks.soak import SoakConfig, SoakReport, SoakRow, reference, run_soak, summary


def test_reference_is_the_sequential_fold():
    state = None
    from driftstream.examples.benchmarks.soak import char, last_chars

    for n in range(1, 40):
        state, out = last_chars(state, {"k": 3, "c": char(3, n)})
        assert out == {"k": 3, "n": n, "s": reference(3, n)}


def _rows(latencies: list) -> list:
    """Report rows 10 s apart whose windows had latency p50 x, p95 2x, p99 3x."""
    return [SoakRow(at_s=10.0 * (i + 1), sent=0, emitted=0, released=0, source_lag=0, checked=0, latency_p50_ms=x,
                    latency_p99_ms=3 * x, latency_p95_ms=2 * x, fetch_ms=[], actor_rss_mb={}, broker_cpu=None, host_cpu=50.0)
            for i, x in enumerate(latencies)]


def test_the_summary_compares_the_first_and_last_span():
    flat = SoakReport(SoakConfig(compare_s=30.0), rows=_rows([100, 104, 98, 5_000, 101, 106, 99]))
    text = summary(flat)
    assert ("end to end (producer -> output record) p50 / p95 / p99 ms: first 100 / 200 / 300, last 101 / 202 / 303: "
            "p50 +1%, p95 +1%, p99 +1% (within 10%)") in text
    growing = SoakReport(SoakConfig(compare_s=300.0), rows=_rows([100, 100, 150, 200, 200, 200]))
    text = summary(growing)  # a span of at most half the run: 30 s here
    assert "first 100 / 200 / 300, last 200 / 400 / 600: p50 +100%, p95 +100%, p99 +100%\n" in text


@pytest.mark.slow
def test_a_steady_kafka_flow_keeps_reading_and_releases_every_record_once(ray_session, kafka_broker, tmp_path):
    cfg = SoakConfig(
        rate=1000, seconds=14, partitions=1, linger_ms=0, guarantee="exactly-once", snapshot_interval=1.0,
        snapshot_dir=str(tmp_path / "snaps"), bootstrap=kafka_broker.bootstrap_servers,
        topic="soak-test", report_s=3.0, drain_s=60.0, quiet=True,
    )
    report = run_soak(cfg)
    print(summary(report))
    assert report.sent == 14_000
    assert report.ok, summary(report)  # every record released, once, with the sequential state
    # Bounded lag: never more than 5 s of input behind (a stalled source falls behind by the rate).
    assert report.max_source_lag < 5_000, [r.source_lag for r in report.rows]
    late = report.rows[len(report.rows) // 2 :]
    assert all(r.emitted >= r.sent - 5_000 for r in late), [(r.sent, r.emitted) for r in late]
    # Every report window released records, and latency did not grow with the run (a source
    # that slows as its partition's log grows shows as a last p50 many times the first).
    p50s = [r.latency_p50_ms for r in report.rows]
    p50s = p50s[next((i for i, x in enumerate(p50s) if x is not None), len(p50s)):]  # from the first release on
    assert len(p50s) >= 2 and None not in p50s, [r.latency_p50_ms for r in report.rows]
    assert p50s[-1] <= 10 * p50s[0] + 200, p50s
