"""The base-row benchmark: the rows it writes are the distinct entries of each base's documents."""

from __future__ import annotations

from driftstream.examples.benchmarks.base_rows import base_row_costs, folds


def test_each_base_writes_each_entry_its_documents_changed_once():
    bases = folds(60, 20)
    figures = base_row_costs(docs=60, per_base=20, rounds=1)
    assert figures["bases"] == 3
    assert figures["rows"] == sum(len({key for key, _ in writes}) for writes in bases)
    assert figures["writer_us_per_row"] > 0 and figures["process_us_per_row"] >= figures["writer_us_per_row"] * 0.5
