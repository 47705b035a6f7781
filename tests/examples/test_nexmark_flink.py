"""Nexmark on Flink: the order-free check of its results and the pieces around the job
(always), and one small real run of every query on a local Flink mini cluster, checked
against the simulator (slow; needs an interpreter with pyflink, see
:mod:`driftstream.examples.flink_job`: ``DRIFTSTREAM_FLINK_PYTHON``)."""

from __future__ import annotations

import random

import pytest

from driftstream.examples.nexmark import bench
from driftstream.examples.nexmark.flink_queries import (
    QUERIES,
    SELECTS,
    SINK_COLUMNS,
    check_results,
    expected_results,
    feed_files,
    release_times,
    run_flink_backlog,
    run_flink_latency,
    statements,
)
from driftstream.examples.nexmark.generator import events
from driftstream.examples.nexmark.queries import QUERIES as DRIFTSTREAM_QUERIES
from tests.examples.test_flink_baseline import _flink_python, _processes_mentioning

JOB_MODULE = "driftstream.examples.nexmark.flink_queries"
EVENTS = events(3000, rate=200)  # 15 s of event time: windows of every query close


@pytest.fixture(scope="module")
def expected() -> dict:
    return {q: expected_results(q, EVENTS) for q in QUERIES}


def as_flink_writes(rows: list) -> list:
    """The rows as Flink's json sink gives them back: numbers as doubles where its columns are DOUBLE, in any order."""
    out = [{k: float(v) if k in ("start", "end", "window_start") else v for k, v in r.items()} for r in rows]
    return random.Random(7).sample(out, len(out))


@pytest.mark.parametrize("query", QUERIES)
def test_the_same_rows_in_any_order_pass(expected, query):
    assert expected[query]
    assert check_results(as_flink_writes(expected[query]), expected[query]) == []


@pytest.mark.parametrize("query", ["q1", "q5", "q8"])
def test_a_missing_or_duplicated_row_fails(expected, query):
    rows = expected[query]
    missing = check_results(rows[1:], rows)
    assert len(missing) == 1 and missing[0].startswith("1 row(s) missing")
    twice = check_results([*rows, rows[-1]], rows)
    assert len(twice) == 1 and twice[0].startswith("1 row(s) too many")
    key = next(iter(rows[0]))
    changed = check_results([*rows[1:], {**rows[0], key: -1}], rows)
    assert len(changed) == 2 and "missing" in changed[0] and "too many" in changed[1]


def test_the_q5_ties_must_be_listed_as_ours_lists_them(expected):
    tie = next(r for r in expected["q5"] if len(r["auctions"]) > 1)
    reordered = [r if r is not tie else {**r, "auctions": r["auctions"][::-1]} for r in expected["q5"]]
    assert check_results(reordered, expected["q5"])


def test_every_query_has_its_sql_and_the_queries_are_ours():
    assert QUERIES == DRIFTSTREAM_QUERIES
    for q in QUERIES:
        assert q in SELECTS and q in SINK_COLUMNS
        sql = statements("/in", "/out", [q])
        assert sql[-1].startswith(f"INSERT INTO out_{q} ") and sum(s.startswith("INSERT") for s in sql) == 1
    fed = statements("/in", "/out", QUERIES, watermark_delay=0.5, monitor_interval=0.05)
    assert "'source.monitor-interval' = '50 ms'" in fed[0] and "INTERVAL '0.500' SECOND" in fed[0]
    assert all("'sink.rolling-policy.rollover-interval' = '100 ms'" in s for s in fed if s.startswith("CREATE TABLE out_"))


def test_release_times_point_at_the_releasing_event(expected):
    times = {e["time"] for e in EVENTS}
    for q in ("q1", "q2", "q3"):
        assert set(release_times(q, expected[q], EVENTS)) <= times
    assert release_times("q7", expected["q7"], EVENTS) == [10.0, 20.0]


def test_the_fed_files_hold_every_event_once_in_order_then_the_flushes():
    files = feed_files(EVENTS, rate=200, file_interval=0.1)
    lines = [line for name, text, _ in files if name.startswith("events-") for line in text.splitlines()]
    assert len(lines) == len(EVENTS) and len(files) == 150 + 2
    dues = [due for _, _, due in files]
    assert dues == sorted(dues) and dues[0] == pytest.approx(19 / 200)
    assert [name for name, _, _ in files[-2:]] == ["flush-0.json", "flush-1.json"]


def test_the_bench_leaves_flink_out_with_a_note_when_there_is_no_interpreter(monkeypatch, capsys):
    import driftstream.examples.flink_job as flink_job

    def missing(python=None):
        raise RuntimeError("no Python with pyflink: install it")

    monkeypatch.setattr(flink_job, "flink_python", missing)
    assert bench._flink_python(None) is None
    assert capsys.readouterr().out.startswith("flink left out: no Python with pyflink")
    assert bench._flink_python(False) is None
    with pytest.raises(RuntimeError):
        bench._flink_python(True)


@pytest.mark.slow
def test_every_query_on_flink_equals_the_simulator(tmp_path, expected):
    python = _flink_python(JOB_MODULE)
    rows = run_flink_backlog(QUERIES, EVENTS, tmp_path, expected=expected, python=python)  # one job, the six as a statement set
    assert [r["query"] for r in rows] == list(QUERIES)
    for r in rows:
        assert r["correct"] is True, (r["query"], r["problems"])
        assert r["results"] == len(expected[r["query"]]) > 0
        assert 0 < r["events_per_s"] <= min(r["events_per_s_after_first_output"], r["events_per_s_from_reading"])
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_a_paced_q5_on_flink_is_correct_with_latencies(tmp_path):
    python = _flink_python(JOB_MODULE)
    evs = events(800, rate=200)  # 4 s fed: sliding windows (every 2 s) close as it goes, the last ones by the flush
    row = run_flink_latency("q5", evs, tmp_path, rate=200, python=python)
    assert row["correct"] is True, row["problems"]
    assert row["results"] == len(expected_results("q5", evs)) and 0 < row["p50_ms"] <= row["p99_ms"]
    assert row["achieved_rate"] == pytest.approx(200, rel=0.2)
    assert _processes_mentioning(str(tmp_path)) == []
