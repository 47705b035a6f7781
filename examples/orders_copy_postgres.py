"""A table's changes as a stream: ``orders`` is copied into ``orders_copy`` by a flow that
reads its inserts, updates and deletes through logical replication (``PostgresSource``) and
applies them with an upsert sink, exactly once: the copy equals the table after every commit
the flow has caught up with.

Run it on a server of yours (``wal_level = logical``), or without ``DRIFTSTREAM_POSTGRES_DSN``
on a local one (stopped when the process exits)::

    DRIFTSTREAM_POSTGRES_DSN="host=db dbname=app user=app" driftstream run driftstream.examples.orders_copy_postgres:flow
    python -m driftstream.examples.orders_copy_postgres     # changes orders for 5 s, then checks the copy
"""

from __future__ import annotations

import random
import threading
import time
from typing import Optional

from driftstream.engine import Flow, PostgresSink, PostgresSource
from driftstream.examples.word_counts_postgres import dsn

TABLE, COPY = "orders", "orders_copy"
SLOT, PUBLICATION = "driftstream_orders", "driftstream_orders"


def flow(server: Optional[str] = None) -> Flow:
    """Changes of ``orders`` into ``orders_copy`` (both created if missing) at ``server``."""
    import psycopg

    server = server or dsn()
    with psycopg.connect(server, autocommit=True) as conn:
        for table in (TABLE, COPY):
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL)")
    f = Flow("orders_copy_postgres")
    (f.source(PostgresSource(server, PUBLICATION, SLOT, tables=[TABLE]), name="changes")
      .key_by(lambda change: change.row["id"], name="by_id")
      .sink(PostgresSink(server, COPY, mode="upsert", key=["id"])))
    return f


def change_orders(server: str, seconds: float, seed: int = 1) -> int:
    """Random inserts, updates and deletes of ``orders`` for ``seconds``; returns the transactions."""
    import psycopg

    rng, done, end = random.Random(seed), 0, time.time() + seconds
    with psycopg.connect(server) as conn:
        while time.time() < end:
            with conn.transaction():
                i = rng.randrange(200)
                if rng.random() < 0.8:
                    conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET amount = EXCLUDED.amount",
                                 (i, f"c{i % 17}", rng.randrange(1, 10_000) / 100))
                else:
                    conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (i,))
            done += 1
            time.sleep(0.005)
    return done


def main(seconds: float = 5.0) -> None:
    from driftstream.engine.connectors.postgres_sink import read_table

    server = dsn()
    handle = flow(server).start(parallelism=2, snapshot_interval=1.0)
    try:
        writer = threading.Thread(target=lambda: print("transactions:", change_orders(server, seconds)))
        writer.start()
        writer.join()
        deadline = time.time() + 60
        while read_table(server, COPY, order_by="id") != read_table(server, TABLE, order_by="id"):
            if time.time() > deadline:
                raise SystemExit(f"{COPY} did not catch up with {TABLE} within 60 s: {handle.status()}")
            time.sleep(0.2)
        print(f"{COPY} equals {TABLE}: {len(read_table(server, TABLE))} rows")
    finally:
        handle.stop(timeout=60)


if __name__ == "__main__":
    main()
