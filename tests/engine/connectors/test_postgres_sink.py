"""PostgresSink on a real PostgreSQL: rows and each partition's t_last in one transaction,
so a recovery neither loses nor repeats a row; upsert keeps each key's latest element."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.postgres_sink import PROGRESS_TABLE, PostgresSink, read_table
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource
from tests.conftest import flow_actors
from tests.reference import reference_outputs


def _table(pg, ddl: str) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(ddl.format(name=name))
    return name


def _count(n, e):
    n = (n or 0) + e["v"]
    return n, {"k": e["k"], "i": e["i"], "total": n}


def build(source, sink, name: str) -> Flow:
    flow = Flow(name)
    flow.source(source, name="events").key_by(lambda e: e["k"], name="key").stateful_map(_count, name="total").sink(sink)
    return flow


EVENTS = [{"k": f"k{i % 7}", "i": i, "v": i % 5} for i in range(600)]


def test_the_table_is_checked_before_the_run(postgres):
    plain = _table(postgres, "CREATE TABLE {name} (k text, i int, total int)")
    strict = _table(postgres, "CREATE TABLE {name} (k text, i int, total int, note text NOT NULL)")
    cases = [
        (PostgresSink(postgres.dsn, "no_such_table"), "does not exist: create it first"),
        (PostgresSink(postgres.dsn, plain, columns=["k", "x"]), "has no column 'x'"),
        (PostgresSink(postgres.dsn, plain, mode="upsert", key=["k"]), r"needs a primary key or unique constraint on exactly \['k'\]"),
        (PostgresSink(postgres.dsn, strict, columns=["k", "i", "total"]), "needs 'note' .NOT NULL, no default."),
        (PostgresSink("host=127.0.0.1 port=1 dbname=x user=x password=hunter2", plain), r"cannot connect to PostgreSQL at .*password=\*\*\*"),
    ]
    for sink, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            build(MemorySource(EVENTS[:5]), sink, "checked").run(runtime="simulator")
        assert "hunter2" not in str(info.value)
    with pytest.raises(FlowError, match="needs key="):
        PostgresSink(postgres.dsn, plain, mode="upsert")


def test_an_element_that_is_not_a_row_names_the_element(postgres):
    table = _table(postgres, "CREATE TABLE {name} (k text, i int, total int)")
    flow = Flow("notarow")
    flow.source(MemorySource([{"k": "a", "i": 1, "total": 2, "extra": 3}])).sink(PostgresSink(postgres.dsn, table))
    with pytest.raises(Exception, match=r"element \{'k': 'a'.* has 'extra', which .* does not take"):
        flow.run(runtime="simulator")


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_the_simulator_writes_the_reference_output(postgres, mode):
    ddl = "CREATE TABLE {name} (k text PRIMARY KEY, i int, total int)" if mode == "upsert" else "CREATE TABLE {name} (k text, i int, total jsonb)"
    table = _table(postgres, ddl)
    expected = reference_outputs(build(MemorySource(EVENTS, partitions=3), MemorySink("out"), "ref"))["out"]
    sink = PostgresSink(postgres.dsn, table, mode=mode, key=["k"] if mode == "upsert" else None, max_rows=7, commit_interval_s=0)
    build(MemorySource(EVENTS, partitions=3), sink, f"sim-{mode}").run(runtime="simulator", parallelism=2, seed=3)
    rows = read_table(postgres.dsn, table, order_by="i")
    if mode == "append":
        assert rows == sorted(expected, key=lambda r: r["i"])
    else:
        latest = {r["k"]: r for r in expected}
        assert rows == sorted(latest.values(), key=lambda r: r["i"])
    with psycopg.connect(postgres.dsn) as conn:
        progress = conn.execute(f"SELECT sink_partition FROM {PROGRESS_TABLE} WHERE sink_table = %s ORDER BY 1", (table,)).fetchall()
    assert progress and set(progress) <= {(0,), (1,)}


def _slow_rows(pg, table: str) -> None:
    """Every row takes 2 ms to insert: transactions stay open long enough for a kill to land in one."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION slow_row() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$ LANGUAGE plpgsql")
        conn.execute(f"CREATE TRIGGER slow BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION slow_row()")


def _wait_for_a_transaction(pg, application_name: str, deadline: float) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        seen = set()
        while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'active'", (application_name,)).fetchall():
            seen |= {r for r in conn.execute("SELECT application_name, state FROM pg_stat_activity").fetchall()}
            assert time.time() < deadline, seen


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_exactly_once_with_a_kill_during_a_transaction_and_a_dropped_connection(ray_session, postgres, tmp_path, mode):
    import ray

    ddl = "CREATE TABLE {name} (k text PRIMARY KEY, i int, total int)" if mode == "upsert" else "CREATE TABLE {name} (k text, i int, total int)"
    table = _table(postgres, ddl)
    _slow_rows(postgres, table)
    events = [{"k": f"k{i % 7}", "i": i, "v": i % 5} for i in range(3000)]
    expected = reference_outputs(build(MemorySource(events, partitions=2), MemorySink("out"), "ref"))["out"]
    name = f"pg-{mode}-{uuid.uuid4().hex[:6]}"
    sink = PostgresSink(postgres.dsn, table, mode=mode, key=["k"] if mode == "upsert" else None, commit_interval_s=0.02)
    source = PacedSource(events, rate=400, partitions=2)
    handle = build(source, sink, name).start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                             snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 120
        while handle.status().get("released", 0) < 600:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        _wait_for_a_transaction(postgres, f"driftstream-{table}-1", deadline)  # the killed actor's sink partition, mid-transaction
        ray.kill(ray.get_actor(f"{name}/key/1", namespace="driftstream"), no_restart=True)
        while len(handle.status()["recoveries"]) < 1:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:  # the server drops the sinks' connections
            dropped = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'postgres' "
                                   "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchone()[0]
        result = handle.wait(timeout=180)
    finally:
        if flow_actors(name + "/"):
            handle.stop(timeout=60)
    assert dropped >= 1
    rows = read_table(postgres.dsn, table, order_by="i")
    if mode == "append":
        assert rows == sorted(expected, key=lambda r: r["i"])  # each row once
    else:
        assert rows == sorted({r["k"]: r for r in expected}.values(), key=lambda r: r["i"])
    assert result.metrics.released
