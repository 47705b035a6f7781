"""The inverted index into an Apache Iceberg table, exactly once: each change record a row
of ``index.changes`` (``IcebergSink``), in a SQL catalog on SQLite with a local warehouse
under this user's data directory (``~/.cache/driftstream/iceberg``), or in the catalog
``$DRIFTSTREAM_ICEBERG_CATALOG`` names (pyiceberg's properties as JSON).

    driftstream run driftstream.examples.index_iceberg:flow --parallelism 2
    python -m driftstream.examples.index_iceberg          # runs, then reads the table back

Every run starts the table afresh.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from driftstream.engine import Flow, IcebergSink
from driftstream.engine.testing import MemorySource
from driftstream.examples.inverted_index.pipeline import build

CATALOG_ENV = "DRIFTSTREAM_ICEBERG_CATALOG"
TABLE = "index.changes"

WORDS = ["stream", "state", "order", "time", "window", "key", "snapshot", "replay"]


def catalog() -> dict:
    """pyiceberg catalog properties: ``$DRIFTSTREAM_ICEBERG_CATALOG``, else a SQLite catalog here."""
    if os.environ.get(CATALOG_ENV):
        return json.loads(os.environ[CATALOG_ENV])
    from driftstream.engine.model.private_dir import data_dir, private

    root = private(str(data_dir() / "iceberg"))
    return {"uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}


def documents(n: int = 300) -> list:
    """Pages over a small vocabulary: each word's posting list grows with every page."""
    return [{"page_id": i, "text": " ".join(WORDS[(i * j + j) % len(WORDS)] for j in range(1, 10))} for i in range(n)]


def flow(props: Optional[dict] = None, docs: int = 300) -> Flow:
    """The index flow into a fresh ``index.changes``."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    props = props or catalog()
    cat = load_catalog("default", **props)
    cat.create_namespace_if_not_exists("index")
    if cat.table_exists(TABLE):
        cat.drop_table(TABLE)
    cat.create_table(TABLE, schema=pa.schema([("op", pa.string()), ("word", pa.string()), ("page_id", pa.int64()),
                                             ("positions", pa.list_(pa.int64())), ("df", pa.int64())]))
    return build(MemorySource(documents(docs), partitions=2), IcebergSink(TABLE, props), name="index_iceberg")


def main() -> None:
    from pyiceberg.catalog import load_catalog

    props = catalog()
    # fresh: flow() recreates the table, so the snapshots of an earlier run of this example are stale
    print(flow(props).run(parallelism=2, guarantee="exactly-once", fresh=True).metrics.summary())
    rows = load_catalog("default", **props).load_table(TABLE).scan().to_arrow()
    print(f"{TABLE}: {rows.num_rows} rows; df of each word:",
          {w: max(r["df"] for r in rows.to_pylist() if r["word"] == w) for w in WORDS})


if __name__ == "__main__":
    main()
