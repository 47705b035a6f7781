"""The broker-log probe against a real local broker: what it reports must agree with
what the broker's log then holds.

It gets a Tansu of its own: on Tansu 0.6.0 a DeleteRecords request panics the broker's
handler (it drops the connection and keeps running), which the session broker's other
users should not see.
"""

from __future__ import annotations

import pytest
from kafka import TopicPartition

from driftstream.engine.connectors.kafka.io import consumer
from driftstream.engine.connectors.local_kafka import local_kafka
from driftstream.examples.benchmarks.broker_log import LogPoint, fit_us_per_batch, probe, summary


def test_the_slope_is_fitted_in_microseconds_per_batch():
    points = [LogPoint(b, 0.5 + 0.001 * b, 0.3) for b in (1_000, 2_000, 4_000)]
    assert fit_us_per_batch(points) == pytest.approx(1.0)
    assert fit_us_per_batch(points[:1]) is None


def test_the_probe_reports_what_the_broker_did_to_its_log():
    with local_kafka() as broker:
        report = probe(broker.bootstrap_servers, batches=3_000, step=1_000, tries=5, retention_wait_s=2.0, topic="probe")
        assert [p.batches for p in report.points] == [1_000, 2_000, 3_000]
        assert all(p.fetch_ms > 0 and p.write_ms > 0 for p in report.points)
        cut = report.truncation
        assert cut.requested == 2_999 and cut.fetch_ms > 0  # the end is still readable, whatever the broker did
        # The report says what the log's start now is: check it against the broker.
        c = consumer(broker.bootstrap_servers)
        try:
            topic = next(t for t in c.topics() if t.startswith("probe-") and "retention" not in t)
            tp = TopicPartition(topic, 0)
            assert c.beginning_offsets([tp])[tp] == cut.log_start
        finally:
            c.close()
        assert cut.supported == (cut.error is None and cut.log_start == 2_999)
        if not cut.supported:
            assert cut.error or cut.log_start == 0
        assert report.retention.waited_s >= (0.0 if report.retention.enforced else 2.0)
        text = summary(report)
        assert "DeleteRecords: " + ("supported" if cut.supported else "not supported") in text
