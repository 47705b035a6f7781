"""What the database and table sinks cost on the inverted index: rows/s over a backlog
(PostgresSink append and upsert, IcebergSink) and latency at 50 docs/s (PostgresSink
append, IcebergSink), each against a FileSink run of the same flow in the same
invocation (the ratio is the figure; this machine is shared and noisy).

    driftstream bench sinks                         # a local PostgreSQL, a SQLite Iceberg catalog
    driftstream bench sinks --docs 3000 --latency-docs 500 --dsn "host=db user=app"

Every run: the index over the corpus's article leads (:func:`.backlog.documents`), Ray,
parallelism 2, exactly-once, 1 s snapshots. Backlog: the documents in place
(MemorySource); rows/s = change records / seconds from ``flow.run`` to its return, each
table then counted against the FileSink's records (append: every record; upsert: one row
per word and page). Latency: the documents paced at ``--rate`` (PacedSource); source
emit -> the sink's commit acknowledged, p50/p95/p99 (``metrics.latency_ms``), with the
sinks' default ``commit_interval_s`` (PostgreSQL 0: a transaction per bundle; Iceberg 1 s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Optional

from driftstream.engine.connectors.file_sink import FileSink

#: change records: one row each (append); one row per (word, page) (upsert)
APPEND_DDL = "CREATE TABLE {name} (op text, word text, page_id bigint, positions jsonb, df int)"
UPSERT_DDL = "CREATE TABLE {name} (op text, word text, page_id bigint, positions jsonb, df int, PRIMARY KEY (word, page_id))"


def _sinks(dsn: str, work: Path) -> dict:
    import psycopg

    from driftstream.engine.connectors.postgres_sink import PostgresSink

    out = {"file": lambda: FileSink(work / f"out-{uuid.uuid4().hex[:6]}", name="changes")}
    for mode, ddl in (("append", APPEND_DDL), ("upsert", UPSERT_DDL)):
        def make(mode=mode, ddl=ddl):
            table = f"bench_{mode}_{uuid.uuid4().hex[:6]}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(ddl.format(name=table))
            return PostgresSink(dsn, table, mode=mode, key=["word", "page_id"] if mode == "upsert" else None)
        out[f"postgres {mode}"] = make

    def iceberg():
        import pyarrow as pa
        from pyiceberg.catalog import load_catalog

        from driftstream.engine.connectors.iceberg_sink import IcebergSink

        props = {"uri": f"sqlite:///{work}/catalog.db", "warehouse": f"file://{work}/warehouse"}
        cat = load_catalog("default", **props)
        cat.create_namespace_if_not_exists("bench")
        table = f"bench.changes_{uuid.uuid4().hex[:6]}"
        cat.create_table(table, schema=pa.schema([("op", pa.string()), ("word", pa.string()), ("page_id", pa.int64()),
                                                  ("positions", pa.list_(pa.int64())), ("df", pa.int64())]))
        return IcebergSink(table, props)
    out["iceberg"] = iceberg
    return out


def _rows(dsn: str, sink) -> Optional[int]:
    """The rows the sink's table holds (None for a file)."""
    from driftstream.engine.connectors.iceberg_sink import IcebergSink
    from driftstream.engine.connectors.postgres_sink import PostgresSink

    if isinstance(sink, IcebergSink):
        return sink.load().scan().to_arrow().num_rows
    if not isinstance(sink, PostgresSink):
        return None
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM {sink.table}").fetchone()[0]


def run(dsn: str, docs: list, latency_docs: int, rate: float) -> list:
    """One row of figures per sink and run kind."""
    import time

    from driftstream.engine.testing import MemorySource, PacedSource
    from driftstream.examples.inverted_index.pipeline import build

    work = Path(tempfile.mkdtemp(prefix="driftstream-bench-pg-"))
    rows: list = []
    try:
        makers = _sinks(dsn, work)
        expected = None
        for name, make in makers.items():  # the backlog
            sink = make()
            started = time.perf_counter()
            result = build(MemorySource(docs, partitions=2), sink, name=f"pg-backlog-{uuid.uuid4().hex[:4]}").run(
                parallelism=2, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(work / f"snaps-{uuid.uuid4().hex[:6]}"))
            seconds = time.perf_counter() - started
            released = sum(result.metrics.released.values())
            expected = released if name == "file" else expected
            rows.append({"run": "backlog", "sink": name, "docs": len(docs), "records": released, "seconds": round(seconds, 2),
                         "records_per_s": round(released / seconds), "table_rows": _rows(dsn, sink)})
        for name, make in makers.items():  # latency at a steady rate
            if name == "postgres upsert":
                continue
            sink = make()
            result = build(PacedSource(docs[:latency_docs], rate=rate, partitions=2), sink, name=f"pg-latency-{uuid.uuid4().hex[:4]}").run(
                parallelism=2, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(work / f"snaps-{uuid.uuid4().hex[:6]}"))
            lat = result.metrics.latency_ms
            rows.append({"run": f"latency at {rate:g} docs/s", "sink": name, "docs": latency_docs, "records": sum(result.metrics.released.values()),
                         **{q: round(lat[q], 1) for q in ("p50", "p95", "p99")}, "table_rows": _rows(dsn, sink)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows: list) -> str:
    lines = ["| run | sink | records | records/s | vs file | p50 / p95 / p99 ms | table rows |", "|---|---|---|---|---|---|---|"]
    base = {r["run"]: r for r in rows if r["sink"] == "file"}
    for r in rows:
        ratio = f"{r['records_per_s'] / base[r['run']]['records_per_s']:.2f}x" if "records_per_s" in r else ""
        lat = f"{r['p50']} / {r['p95']} / {r['p99']}" if "p50" in r else ""
        lines.append(f"| {r['run']} | {r['sink']} | {r['records']:,} | {r.get('records_per_s', '')} | {ratio} | {lat} | {r['table_rows'] if r['table_rows'] is not None else ''} |")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench sinks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2000, help="documents in the backlog (default 2000)")
    parser.add_argument("--latency-docs", type=int, default=500, help="documents paced for the latency runs (default 500)")
    parser.add_argument("--rate", type=float, default=50.0, help="docs/s of the latency runs (default 50)")
    parser.add_argument("--dsn", help="a PostgreSQL to use (default: a local one, started and stopped here)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    from driftstream.examples.benchmarks.backlog import documents
    from driftstream.examples.benchmarks.postgres_session import ray_and_postgres

    docs = documents(max(args.docs, args.latency_docs))
    with ray_and_postgres(args.dsn) as dsn:
        rows = run(dsn, docs[:args.docs], args.latency_docs, args.rate)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
