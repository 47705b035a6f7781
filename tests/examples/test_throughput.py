"""The throughput figures: fifths of a run, completions, the summary."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from driftstream.examples.inverted_index.throughput import document_completions, fifth_rates, summary

completions = st.lists(st.tuples(st.floats(0.01, 10.0), st.integers(1, 50)), min_size=1, max_size=30)


@given(completions)
def test_the_fifths_add_up_to_the_run(steps):
    """Each fifth's documents over its rate is its duration: together, the whole run."""
    t, events = 0.0, []
    for gap, n in steps:
        t += gap
        events.append((t, n))
    total = sum(n for _, n in events)
    rates = fifth_rates(0.0, events, total)
    assert len(rates) == 5
    assert abs(sum(total / 5 / r for r in rates) - t) < 0.01 * t + 1e-3


def test_a_slower_end_shows_in_the_last_fifth():
    steady = [(float(i), 10) for i in range(1, 9)] + [(10.0 + 4 * i, 10) for i in range(1, 3)]
    rates = fifth_rates(0.0, steady, 100)
    assert rates[:4] == [10.0] * 4
    assert rates[4] < rates[0] / 2


def test_a_document_is_done_with_its_last_record_and_others_pages_do_not_count():
    docs = [{"page_id": 1, "text": "a b a"}, {"page_id": 2, "text": "c"}]
    arrivals = [(100.0, {"page_id": 1}), (150.0, {"page_id": 9}), (200.0, {"page_id": 2}), (300.0, {"page_id": 1})]
    assert document_completions(docs, arrivals) == [(0.2, 1), (0.3, 1)]


def test_a_run_that_left_documents_undone_is_not_correct():
    s = summary("x", 10, 5, 0.0, [(1.0, 4)], [])
    assert not s["correct"]
    assert s["problems"] == ["4 of 10 documents done"]


def test_spark_one_batch_reads_the_whole_backlog_as_one_micro_batch(monkeypatch, tmp_path):
    """Issue 57's Kafka basis compares with Spark reading the backlog as one micro-batch:
    the ``spark-one-batch`` engine asks the native query for every document in one batch
    and says so in its row (the ``spark`` engine keeps its 1,000 a batch)."""
    from driftstream.examples.inverted_index import spark_native, throughput

    asked = []

    def fake_native(docs, workdir, docs_per_batch):  # the query's own run is Spark's (tests/benchmarks)
        asked.append(docs_per_batch)
        return {"rows_out": len(docs), "started": 0.0, "completions": [(2.0, len(docs))], "problems": [],
                "docs_per_batch": docs_per_batch, "seconds_total": 5.0}

    monkeypatch.setattr(spark_native, "run_spark_native", fake_native)
    docs = [{"page_id": i, "text": "a b"} for i in range(1200)]
    one, = throughput.run_all(docs, ["spark-one-batch"], None, tmp_path)
    default, = throughput.run_all(docs, ["spark"], None, tmp_path)
    assert asked == [1200, 1000]
    assert one["engine"] == "spark (native SQL, one micro-batch)" and one["docs_per_batch"] == 1200
    assert default["engine"] == "spark (native SQL)"
