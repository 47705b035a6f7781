"""A run leaves no instance's working directory (its RocksDB files) behind on this node,
also when it fails and its actors are killed before they could report and clean up."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource


def _total_until_the_pill(total, x):
    if x == "pill":
        raise ValueError("a pill")
    total = (total or 0) + x
    return total, total


def test_a_failed_run_leaves_no_working_directory(ray_session, tmp_path):
    name = f"workdirs-{uuid.uuid4().hex[:8]}"
    flow = Flow(name)
    items = [i % 7 for i in range(3000)] + ["pill"]
    flow.source(MemorySource(items)).key_by(lambda x: 0, name="one").stateful_map(_total_until_the_pill, name="total").sink(MemorySink("out"))
    with pytest.raises(Exception, match="a pill"):
        flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.1, snapshot_dir=str(tmp_path / "snaps"))
    left = sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"driftstream-{name}-*"))
    assert left == []
