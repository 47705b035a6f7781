"""PostgresSink on a real PostgreSQL: rows and each partition's t_last in one transaction,
so a recovery neither loses nor repeats a row; upsert keeps each key's latest element."""

from __future__ import annotations

import os
import threading
import time
import uuid

import psycopg
import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.postgres_sink import PROGRESS_TABLE, PostgresSink, read_table
from driftstream.engine.connectors.row_changes import Insert, Update
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource, wait_for_actor
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
        ray.kill(wait_for_actor(f"{name}/key/1", timeout=30), no_restart=True)
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


def _apply_changes(pg, table: str, changes: list, max_rows: int = 10_000) -> list:
    """``changes`` through a PostgresSink(mode="upsert", key=["id"]) into ``table``, in order (one partition); its rows after."""
    flow = Flow(f"changes-{uuid.uuid4().hex[:6]}")
    flow.source(MemorySource(changes)).sink(PostgresSink(pg.dsn, table, mode="upsert", key=["id"], max_rows=max_rows))
    flow.run(runtime="simulator")
    return read_table(pg.dsn, table, order_by="id")


@pytest.mark.parametrize("max_rows", [1, 10_000])  # a transaction per change, and all in one
def test_an_update_that_changes_the_key_moves_the_row(postgres, max_rows):
    table = _table(postgres, "CREATE TABLE {name} (id int PRIMARY KEY, v text, doc jsonb, big text)")
    big = "x" * 5000
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:  # rows already there, as a copy holds them
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a', '{{\"n\": 1}}', %s), (2, 'b', null, 'b'), (3, 'c', '[3]', 'c')", (big,))
    t = f"public.{table}"
    rows = _apply_changes(postgres, table, [
        # the server's old key: only when the key changed; TOASTed columns left unchanged are not sent
        Update(t, {"id": 10, "v": "a2"}, old={"id": 1}, unchanged=("doc", "big")),
        Update(t, {"id": 10, "v": "a3"}, unchanged=("doc", "big")),
        # a swap of keys 2 and 3 through 4, within one transaction of the source
        Update(t, {"id": 4, "v": "b", "doc": None, "big": "b"}, old={"id": 2}),
        Update(t, {"id": 2, "v": "c", "doc": [3], "big": "c"}, old={"id": 3}),
        Update(t, {"id": 3, "v": "b", "doc": None, "big": "b"}, old={"id": 4}),
        Insert(t, {"id": 1, "v": "new", "doc": None, "big": None}),  # the old key used again
    ], max_rows)
    assert rows == [{"id": 1, "v": "new", "doc": None, "big": None},
                    {"id": 2, "v": "c", "doc": [3], "big": "c"},
                    {"id": 3, "v": "b", "doc": None, "big": "b"},
                    {"id": 10, "v": "a3", "doc": {"n": 1}, "big": big}]


def test_a_key_change_read_from_the_source_leaves_one_row_equal_to_the_source_table(postgres):
    """The changes as PostgresSource reads them (default and full replica identity, a TOASTed
    column left unchanged) applied by the sink give the source table's rows."""
    from driftstream.engine.connectors.postgres_source import PostgresSource

    source_table = _table(postgres, "CREATE TABLE {name} (id int PRIMARY KEY, v text, big text)")
    copy = _table(postgres, "CREATE TABLE {name} (id int PRIMARY KEY, v text, big text)")
    tag = uuid.uuid4().hex[:8]
    source = PostgresSource(postgres.dsn, f"pub_{tag}", f"slot_{tag}", tables=[source_table], tick_interval=None)
    source.partitions()
    big = os.urandom(4000).hex()  # 8000 characters pglz cannot shrink: stored out of line (TOASTed)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {source_table} VALUES (1, 'a', %s), (2, 'b', 'small')", (big,))
        conn.execute(f"UPDATE {source_table} SET id = 11 WHERE id = 1")
        conn.execute(f"UPDATE {source_table} SET v = 'a2' WHERE id = 11")
        conn.execute(f"ALTER TABLE {source_table} REPLICA IDENTITY FULL")
        conn.execute(f"UPDATE {source_table} SET id = 12 WHERE id = 11")
        conn.execute(f"UPDATE {source_table} SET id = 3 WHERE id = 2")
        expected = conn.execute(f"SELECT * FROM {source_table} ORDER BY id").fetchall()
    reader = source.open(0, 0)
    try:
        changes, deadline = [], time.time() + 30
        while len(changes) < 6:
            assert time.time() < deadline, changes
            changes += [p for _, p in reader.read(100)]
    finally:
        reader.close()
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f"SELECT pg_drop_replication_slot('slot_{tag}')")
    assert changes[2].old == {"id": 1} and changes[2].unchanged == ("big",)  # what the test is about
    rows = _apply_changes(postgres, copy, changes)
    assert [tuple(r.values()) for r in rows] == expected == [(3, "b", "small"), (12, "a2", big)]


def test_an_old_key_without_the_sinks_key_is_warned_about_once(postgres, caplog):
    table = _table(postgres, "CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    t = f"public.{table}"
    with caplog.at_level("WARNING"):
        rows = _apply_changes(postgres, table, [Insert(t, {"id": 1, "v": "a"}), Update(t, {"id": 1, "v": "b"}, old={"other": 7}),
                                                Update(t, {"id": 1, "v": "c"}, old={"other": 8})])
    assert rows == [{"id": 1, "v": "c"}]
    assert [r.message for r in caplog.records if "names its old key without ['id']" in r.message and "REPLICA IDENTITY FULL" in r.message] != []
    assert len([r for r in caplog.records if "names its old key" in r.message]) == 1


@pytest.mark.parametrize("dsn, shown", [
    ("host=db user=u password='two words' dbname=x", "host=db user=u password=*** dbname=x"),  # bc7b6d0 showed "words'"
    ("host=db password = 'it\\'s secret' user=u", "host=db password = *** user=u"),
    ("host=db password='never closed", "host=db password=***"),
    ("host=db password=plain user=u", "host=db password=*** user=u"),
    ("postgresql://u:pw@db:5432/x?sslmode=require", "postgresql://u:***@db:5432/x?sslmode=require"),
    ("postgresql://u@db/x?password=p2&sslmode=require", "postgresql://u@db/x?password=***&sslmode=require"),
])
def test_a_dsn_is_shown_without_its_password(dsn, shown):
    from driftstream.engine.connectors.postgres_sink import _mask

    assert _mask(dsn) == shown
