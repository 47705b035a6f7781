"""The inverted index's stages in one process (driftstream bench index-stage, short). Figures
are printed and kept in pytest-benchmark's extra_info; asserts that every part is measured,
snapshots were taken and the index emitted one change record per distinct word of each page."""

from __future__ import annotations

from driftstream.examples.benchmarks import index_stage
from driftstream.examples.benchmarks.backlog import documents
from driftstream.examples.inverted_index.documents import word_positions


def test_index_stage(benchmark):
    r = benchmark.pedantic(index_stage.index_stage, kwargs={"docs": 200, "rounds": 1, "lag": 8, "snapshot_every": 64},
                           rounds=1, iterations=1)
    print("\n", r)
    benchmark.extra_info.update(r["us_per_record"])
    assert r["records"] == sum(len(word_positions(d["text"])) for d in documents(200))
    assert r["snapshots"] == 3
    assert all(us > 0 for us in r["us_per_record"].values()), r
