"""The paced example for trying the CLI keeps running (it does not end before `status` and
`stop` can show it), releases window counts as it goes, and stops when asked."""

from __future__ import annotations

from driftstream.engine.connectors.file_sink import read_file_sink
from driftstream.examples.live_clicks import build

from tests.status_wait import wait_for_status


def test_the_live_example_runs_until_stopped_and_writes_counts(ray_session, tmp_path):
    handle = build(rate=200.0, out_dir=str(tmp_path)).start(parallelism=2)
    try:
        status = wait_for_status(lambda s: s["running"] and s.get("released", 0) >= 5, handle, "window counts released", timeout=90)
        assert status["running"]
    finally:
        result = handle.stop(timeout=60)
    rows = [row for _, row in read_file_sink(str(tmp_path), "counts")]
    assert len(rows) >= 5 and all(r["end"] - r["start"] == 10.0 and r["clicks"] >= 1 for r in rows)
    assert result.metrics.summary()
