"""The Iceberg example: the table holds the reference's change records."""

from __future__ import annotations

from collections import Counter

from driftstream.examples.index_iceberg import TABLE, documents, flow
from driftstream.examples.inverted_index.ground_truth import reference_changes


def test_the_table_holds_the_reference_changes(tmp_path):
    from pyiceberg.catalog import load_catalog

    props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    f = flow(props, docs=40)
    for s in f.steps:
        if s.kind.is_sink:
            s.sink.commit_interval_s = 0  # the simulator waits for it: no need here
    f.run(runtime="simulator", parallelism=2, seed=1)
    rows = load_catalog("default", **props).load_table(TABLE).scan().to_arrow().to_pylist()
    key = lambda c: (c["word"], c["page_id"], c["op"], tuple(c.get("positions") or ()), c["df"])  # noqa: E731
    assert Counter(map(key, rows)) == Counter(map(key, reference_changes(documents(40))))
