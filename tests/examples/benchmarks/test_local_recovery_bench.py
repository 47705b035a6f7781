"""``driftstream bench local-recovery``, short: parallelism 2, 1,000 elements/s for 2.5 s, the
stateful instance killed 1.2 s in, recovered locally and globally, on the suite's Ray session.

Asserts that every figure is printed and written and the output checked, never their values
(the machine is shared): each killed run equals the failure-free run's output, the local run
restored only the killed instance and the global one every instance."""

from __future__ import annotations

import json

import pytest

from driftstream.examples.benchmarks import bench

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_local_recovery_bench_prints_both_recoveries(ray_session, tmp_path, capsys):
    out = tmp_path / "local.json"
    code = bench.main(["local-recovery", "--parallelism", "2", "--rate", "1000", "--seconds", "2.5", "--kill-at", "1.2",
                       "--snapshot-interval", "0.2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    runs = {r["run"]: r for r in json.loads(out.read_text())}
    assert set(runs) == {"lrb-none", "lrb-local-0", "lrb-global-0"}
    assert runs["lrb-local-0"]["restores"] == {"1/1": 1} and runs["lrb-local-0"]["kinds"] == ["local"]
    assert runs["lrb-global-0"]["restores"] == {"0/0": 1, "0/1": 1, "1/0": 1, "1/1": 1} and runs["lrb-global-0"]["kinds"] == ["global"]
    assert all(runs[r]["first_output_s"] is not None for r in ("lrb-local-0", "lrb-global-0"))
    for word in ("first output", "others' longest gap", "restores", "output equal"):
        assert word in printed
    assert "DIFFERS" not in printed
