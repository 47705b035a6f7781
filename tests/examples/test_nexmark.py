"""Nexmark: the generator is deterministic, and each query's output is the sequential
reference's and what a direct computation over the events gives."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from driftstream.examples.nexmark.generator import events
from driftstream.examples.nexmark.queries import QUERIES, build
from tests.reference import reference_outputs

EVENTS = events(6000, rate=250)  # 24 s of events


@pytest.mark.parametrize("query", QUERIES)
def test_each_query_equals_the_sequential_reference(query):
    flow = build(query, EVENTS)
    expected = reference_outputs(flow)[query]
    assert expected
    assert flow.run(runtime="simulator", parallelism=3, seed=5).output(query) == expected


def test_q7_is_the_highest_bid_of_each_window():
    best: dict = {}
    for e in EVENTS:
        if e["kind"] == "bid":
            w = e["time"] // 10 * 10
            if w not in best or e["price"] > best[w]["price"]:
                best[w] = e
    out = build("q7", EVENTS).run(runtime="simulator", parallelism=2, seed=1).output("q7")
    assert [(r["start"], r["price"], r["auction"]) for r in out] == [(w, b["price"], b["auction"]) for w, b in sorted(best.items())]


def test_q5_finds_the_auctions_with_the_most_bids_per_sliding_window():
    out = build("q5", EVENTS).run(runtime="simulator", parallelism=2, seed=2).output("q5")
    assert out
    for row in out:
        counts = Counter(e["auction"] for e in EVENTS if e["kind"] == "bid" and row["start"] <= e["time"] < row["end"])
        top = max(counts.values())
        assert row["bids"] == top and row["auctions"] == sorted(a for a, n in counts.items() if n == top)


def test_q8_and_q2_against_the_events():
    opened = defaultdict(set)
    for e in EVENTS:
        if e["kind"] == "auction":
            opened[e["time"] // 10 * 10].add(e["seller"])
    new_users = {(e["id"], e["time"] // 10 * 10) for e in EVENTS if e["kind"] == "person" and e["id"] in opened[e["time"] // 10 * 10]}
    q8 = build("q8", EVENTS).run(runtime="simulator", parallelism=2, seed=3).output("q8")
    assert {(r["id"], r["window_start"]) for r in q8} == new_users and len(q8) == len(new_users)
    q2 = build("q2", EVENTS).run(runtime="simulator", parallelism=2, seed=3).output("q2")
    assert q2 == [{"auction": e["auction"], "price": e["price"]} for e in EVENTS if e["kind"] == "bid" and e["auction"] % 123 == 0]


def test_the_generator_gives_the_spec_proportions_and_ids():
    kinds = Counter(e["kind"] for e in EVENTS)
    assert kinds == {"person": 120, "auction": 360, "bid": 5520}
    people = [e["id"] for e in EVENTS if e["kind"] == "person"]
    assert people == list(range(1000, 1120))
    assert all(1000 <= e["seller"] < 1120 for e in EVENTS if e["kind"] == "auction")
    assert events(50, seed=1) != events(50, seed=2) and events(50, seed=1) == events(50, seed=1)


@pytest.mark.parametrize("query", ["q3", "q5"])
def test_the_bench_runs_a_query_exactly_once_on_ray(ray_session, tmp_path, query):
    from driftstream.examples.nexmark.bench import run_query

    row = run_query(query, events(4000, rate=400), tmp_path)
    assert row["correct"] and row["results"] > 0 and row["events_per_s"] > 0
    assert row["cpu_s"] > 0 and row["cpu_us_per_event"] == round(row["cpu_s"] / 4000 * 1e6, 1)  # this process's Ray session


@pytest.mark.parametrize("query", QUERIES)
def test_the_direct_computations_the_bench_checks_with_equal_the_flows(query):
    import json

    from driftstream.examples.nexmark.direct import direct_results
    from driftstream.examples.nexmark.flink_queries import check_results

    flow_rows = json.loads(json.dumps(build(query, EVENTS).run(runtime="simulator", parallelism=2, seed=4).output(query)))
    assert flow_rows and check_results(direct_results(query, EVENTS), flow_rows) == []


def test_the_plain_loop_reads_the_files_the_engines_read(tmp_path):
    from driftstream.examples.nexmark.bench import plain_loop
    from driftstream.examples.nexmark.flink_queries import write_event_files

    write_event_files(EVENTS, tmp_path / "events", 2)
    for query, results in (("q1", 5520), ("q7", 3)):
        row = plain_loop(query, tmp_path / "events", tmp_path / f"{query}.jsonl")
        assert row["correct"] and row["results"] == results and row["events"] == len(EVENTS)
        assert len((tmp_path / f"{query}.jsonl").read_bytes().splitlines()) == results
