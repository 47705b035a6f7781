"""``driftstream bench replicas``, short: parallelism 2, 300 elements/s for 3 s, the primary of
the stateful instance killed 1.5 s in, and a backlog of 5,000, on the suite's Ray session.

Asserts that every figure is printed and written and the output checked, never their values
(the machine is shared): the killed run failed over, restored nothing and equals replicas=1's output."""

from __future__ import annotations

import json

import pytest

from driftstream.examples.benchmarks import bench

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_replicas_bench_prints_the_gaps_and_the_throughput(ray_session, tmp_path, capsys):
    out = tmp_path / "replicas.json"
    code = bench.main(["replicas", "--seconds", "3", "--kill-at", "1.5", "--backlog", "5000", "--snapshot-interval", "0.2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    runs = {r["run"]: r for r in json.loads(out.read_text())}
    assert set(runs) == {"rpb-one", "rpb-none-0", "rpb-kill-0", "rpb-backlog1-0", "rpb-backlog2-0"}
    assert runs["rpb-kill-0"]["kinds"][0] == "failover" and runs["rpb-kill-0"]["restores"] == {}  # then its replacement, or why not
    for words in ("longest gap, killed / not", "throughput replicas=2 / replicas=1", "output equal", "replacement replica joined after the kill"):
        assert words in printed
    assert "DIFFERS" not in printed
