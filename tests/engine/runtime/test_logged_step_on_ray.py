"""A step declared deterministic=False on Ray: its instance is killed mid-run under
exactly-once, and the output is still one consistent run: every element once, and each running
sum the sum of the released draws of its key before it (a recompute would have drawn anew)."""

from __future__ import annotations

import random

import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.testing import PacedSource, kill_at

pytestmark = pytest.mark.ray

N = 3000


def _draw(x):
    return [x[0], x[1], random.randrange(7)]  # a new process, or a reset one, draws other values


def _running(total, x):
    total = (total or 0) + x[2]
    return total, [x[0], x[1], x[2], total]


def test_killed_draws_are_replayed_not_drawn_again(ray_session, tmp_path):
    out = tmp_path / "out"
    flow = Flow("nd-ray")
    (flow.source(PacedSource([("k%d" % (i % 5), i) for i in range(N)], rate=2000, partitions=2), name="src")
         .map(_draw, name="draw", deterministic=False).key_by(lambda x: x[0], name="by_key").stateful_map(_running, name="sum")
         .sink(FileSink(out, name="out")))
    killer = kill_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, [("nd-ray/src/0", N // 3)])
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    killer.join(timeout=5)
    assert not killer.errors, killer.errors
    assert result.metrics.recoveries == 1
    got = [value for _, value in read_file_sink(out, "out")]
    assert sorted(i for _, i, _, _ in got) == list(range(N))  # every element once
    sums: dict = {}
    for key, i, value, total in got:  # per key in t order: each sum is the released draws' so far
        sums[key] = sums.get(key, 0) + value
        assert total == sums[key], f"element {i} of {key}: released sum {total}, released draws {sums[key]}"
