"""driftstream bench backlog: a backlog run on Ray checks its output against the reference
and reports the state cache; both index forms give the same change records."""

from __future__ import annotations

import pytest

from driftstream.examples.benchmarks.backlog import Backlog, run_backlog

DOCS = [{"page_id": i, "text": " ".join(f"w{(i * j) % 13}" for j in range(1, 9))} for i in range(60)]


@pytest.mark.ray
@pytest.mark.parametrize("state", ["entries", "value"])
def test_a_backlog_run_is_checked_and_reports_its_state(ray_session, state):
    figures = run_backlog(Backlog(len(DOCS), state, 2, {"guarantee": "exactly-once", "snapshot_interval": 0.2}), DOCS)
    assert figures["correct"] is True
    assert figures["changes"] == sum(len(set(d["text"].split())) for d in DOCS)
    assert figures["docs_per_s"] > 0 and figures["peak_rss_mib"] > 0
    assert figures["state_cache"]["index"]["records"] > 0
