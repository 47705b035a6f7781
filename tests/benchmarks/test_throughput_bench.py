"""Backlog throughput, short: driftstream (Kafka input topic, exactly-once, 1 s snapshots;
its documents' words per document and by Arrow a batch at a time) and Spark's native streaming SQL (files, exactly-once) over the same 400 documents.
Figures are printed and kept in pytest-benchmark's extra_info;
`driftstream bench inverted-index --throughput` runs the full comparison (Flink too
where it is installed).

Asserts correctness only: driftstream's change records equal the sequential reference,
Spark's final df per word equals the index's.
"""

from __future__ import annotations

import pytest

from driftstream.examples.benchmarks.backlog import documents
from driftstream.examples.inverted_index import throughput

pytestmark = pytest.mark.slow

DOCS = 400


def _check(rows: list, benchmark) -> None:
    (row,) = rows
    benchmark.extra_info.update(row)
    print("\n" + throughput.table(rows))
    assert row["problems"] == [] and row["correct"]
    assert row["docs"] == DOCS and row["records"] > 0
    assert len(row["fifths_docs_per_s"]) == 5


@pytest.mark.ray
@pytest.mark.parametrize("engine", ["driftstream", "driftstream-arrow"])
def test_backlog_throughput(ray_session, kafka_broker, tmp_path, benchmark, engine):
    docs = documents(DOCS)
    _check(benchmark.pedantic(throughput.run_all, args=(docs, [engine], kafka_broker.bootstrap_servers, tmp_path),
                              rounds=1, iterations=1), benchmark)


def test_spark_backlog_throughput(tmp_path, benchmark):
    """Spark's run needs neither Ray nor the broker: it runs beside the tests on Ray, not among them."""
    docs = documents(DOCS)
    _check(benchmark.pedantic(throughput.run_all, args=(docs, ["spark"], None, tmp_path), rounds=1, iterations=1), benchmark)
