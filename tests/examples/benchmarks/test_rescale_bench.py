"""``driftstream bench rescale``, short: the inverted index at 50 docs/s through the test
broker, exactly-once, rescaled 2 -> 3 -> 2 while it runs (2 s of input before the first
rescale, 2 s between and after), on the suite's local Ray session. ``--cluster`` (a
two-node Ray cluster of its own) is left to the bench: a process joins one cluster only.

Asserts correctness and that every figure is printed and written, never their values:
the change records equal the PySpark ground truth, each rescale has its downtime at the
consumer and the engine's drain / restart / first output and restart steps.
"""

from __future__ import annotations

import json
import re

import pytest

from driftstream.examples.benchmarks import bench
from driftstream.examples.benchmarks.rescale import by_direction, parallelisms, schedule
from driftstream.examples.inverted_index.corpus import QUICK_CONF, get_spark

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_steps_and_schedule():
    assert schedule(parallelisms("2,3,2,3"), warmup=5, seconds=2) == ([(5.0, 3), (7.0, 2), (9.0, 3)], 11.0)
    for bad in ("2", "2,2,3", "2,0"):
        with pytest.raises(Exception, match="--steps"):
            parallelisms(bad)
    assert by_direction([]) == {}


def test_rescale_bench_prints_every_figure_and_keeps_the_output(ray_session, kafka_broker, tmp_path, capsys):
    out = tmp_path / "rescale.json"
    # The corpus slice and its ground truth are small PySpark batch jobs, not what is measured:
    # the bench takes the active session, so start it with test_corpus's JVM settings.
    get_spark("driftstream-tests", conf=QUICK_CONF)
    code = bench.main(["rescale", "--bootstrap", kafka_broker.bootstrap_servers, "--steps", "2,3,2", "--warmup", "2", "--seconds", "2",
                       "--skip", "50", "--workdir", str(tmp_path / "work"), "--json", str(out)])
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0, printed
    assert "equals the PySpark ground truth" in printed
    for direction in ("2 -> 3", "3 -> 2"):
        line = next(ln for ln in printed.splitlines() if ln.startswith(direction + " at "))
        for figure in ("downtime", "drain", "restart", "first output"):
            assert re.search(rf"{figure} \d+\.\d{{3}} s", line), line
    assert printed.count("    restart: reassign ") == 2
    assert re.search(r"^2->3, 1 rescale\(s\), median \(range\): downtime", printed, re.M)
    figures = json.loads(out.read_text())
    assert figures["correct"] and figures["problems"] == []
    assert [(r["from"], r["to"]) for r in figures["rescales"]] == [(2, 3), (3, 2)]
    for r in figures["rescales"]:
        assert r["snapshot"] is not None
        assert r["last_before_s"] < r["first_after_s"]  # the gap straddles the restart
        assert list(r["steps_s"]) == ["reassign", "kill", "reset", "connect", "start"]
    assert set(figures["by_direction"]) == {"2->3", "3->2"}
