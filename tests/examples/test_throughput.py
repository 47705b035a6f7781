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
