"""PostgresSource into an upsert PostgresSink (a copy of a changing table): changes/s over a
backlog and commit-to-copy latency at a steady rate.

    driftstream bench cdc                              # a local PostgreSQL
    driftstream bench cdc --backlog 50000 --rate 100 --seconds 30 --dsn "host=db user=app"

Both runs: the flow ``changes -> key_by id -> PostgresSink(copy, mode="upsert")`` on Ray,
parallelism 2, exactly-once, 1 s snapshots. Backlog: ``--backlog`` inserts (transactions of
20 rows) written after the slot is created and before the flow starts; changes/s from the
first row landed in the copy to the last (each row stamps ``landed`` with
``clock_timestamp()`` as it is written), and from the flow's start. Latency: ``--rate``
single-row updates a second for ``--seconds``, each stamping ``created`` in the source
table; a trigger on the copy stamps ``landed`` on every write, so ``landed - created`` is
the server's own clock from the source transaction's write to the copy's, end to end.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Optional


def run(dsn: str, backlog: int, rate: float, seconds: float) -> dict:
    """The figures of one backlog run and one run at ``rate`` updates/s, on one flow."""
    import psycopg

    from driftstream.engine import Flow, PostgresSink, PostgresSource
    from driftstream.engine.model.result import percentiles

    tag = uuid.uuid4().hex[:6]
    src, copy, slot = f"cdc_src_{tag}", f"cdc_copy_{tag}", f"cdc_slot_{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {src} (id int PRIMARY KEY, v int NOT NULL, created timestamptz NOT NULL DEFAULT clock_timestamp())")
        conn.execute(f"CREATE TABLE {copy} (id int PRIMARY KEY, v int, created timestamptz, landed timestamptz NOT NULL DEFAULT clock_timestamp())")
        conn.execute(f"CREATE FUNCTION {copy}_landed() RETURNS trigger AS $$ BEGIN NEW.landed := clock_timestamp(); RETURN NEW; END $$ LANGUAGE plpgsql")
        conn.execute(f"CREATE TRIGGER {copy}_landed BEFORE UPDATE ON {copy} FOR EACH ROW EXECUTE FUNCTION {copy}_landed()")
    source = PostgresSource(dsn, f"cdc_pub_{tag}", slot, tables=[src])
    source.partitions()  # the slot, before the backlog
    with psycopg.connect(dsn, autocommit=True) as conn:
        for b in range(0, backlog, 20):
            with conn.transaction():
                conn.cursor().executemany(f"INSERT INTO {src} (id, v) VALUES (%s, 0)", [(i,) for i in range(b, min(backlog, b + 20))])
    flow = Flow(f"cdc-{tag}")
    (flow.source(source, name="changes").key_by(lambda change: change.row["id"], name="by_id")
         .sink(PostgresSink(dsn, copy, mode="upsert", key=["id"], columns=["id", "v", "created"])))
    started = time.time()
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=1.0)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute(f"SELECT count(*) FROM {copy}").fetchone()[0] < backlog:
                if time.time() - started > 600:
                    raise RuntimeError(f"the copy did not reach {backlog} rows in 600 s: {handle.status()}")
                time.sleep(0.05)
            caught_s = time.time() - started
            first, last = conn.execute(f"SELECT extract(epoch from min(landed)), extract(epoch from max(landed)) FROM {copy}").fetchone()
            running_s = max(1e-3, float(last) - float(first))
            updates, end = 0, time.time() + seconds
            while time.time() < end:
                conn.execute(f"UPDATE {src} SET v = v + 1, created = clock_timestamp() WHERE id = %s", (updates % backlog,))
                updates += 1
                time.sleep(1.0 / rate)
            deadline = time.time() + 60
            while conn.execute(f"SELECT coalesce(sum(v), 0) FROM {copy}").fetchone()[0] < updates:
                if time.time() > deadline:
                    raise RuntimeError(f"the copy did not take all {updates} updates in 60 s")
                time.sleep(0.05)
            latency = [float(x) for (x,) in conn.execute(f"SELECT extract(epoch from landed - created) * 1000 FROM {copy} WHERE v > 0")]
            equal = conn.execute(f"SELECT count(*) FROM {src} s FULL JOIN {copy} c USING (id) WHERE s.v IS DISTINCT FROM c.v").fetchone()[0] == 0
    finally:
        handle.stop(timeout=60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s) FROM pg_replication_slots WHERE slot_name = %s AND NOT active", (slot, slot))
    return {"backlog": backlog, "backlog_s_from_start": round(caught_s, 2), "changes_per_s_from_start": round(backlog / caught_s),
            "changes_per_s_first_to_last": round(backlog / running_s), "rate": rate, "updates": updates, "landed": len(latency),
            **{q: round(v, 1) for q, v in percentiles(latency, (50, 95, 99)).items() if q.startswith("p")}, "copy_equals_source": equal}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench cdc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=20_000, help="inserts written before the flow starts (default 20000)")
    parser.add_argument("--rate", type=float, default=50.0, help="single-row updates a second in the latency run (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the latency run (default 20)")
    parser.add_argument("--dsn", help="a PostgreSQL with wal_level=logical (default: a local one, started and stopped here)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    from driftstream.examples.benchmarks.postgres_session import ray_and_postgres

    with ray_and_postgres(args.dsn) as dsn:
        figures = run(dsn, args.backlog, args.rate, args.seconds)
    print(f"backlog: {figures['backlog']:,} inserts, {figures['changes_per_s_first_to_last']:,} changes/s from the first row landed to "
          f"the last, {figures['changes_per_s_from_start']:,} from the flow's start ({figures['backlog_s_from_start']} s)")
    print(f"latency at {figures['rate']:g} updates/s: {figures['landed']:,} landed; commit -> row in the copy "
          f"p50 {figures['p50']} / p95 {figures['p95']} / p99 {figures['p99']} ms; copy equals the source: {figures['copy_equals_source']}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0 if figures["copy_equals_source"] else 1
