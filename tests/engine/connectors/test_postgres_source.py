"""PostgresSource on a real PostgreSQL (logical replication, pgoutput): changes in commit
order with times from the WAL, a replay from any position gives the same elements, the slot
moves only to committed snapshots' positions, and a flow keeps a copy of a changing table
exact through kills."""

from __future__ import annotations

import random
import threading
import time
import uuid

import psycopg
import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.pg_replication import ReplicationError, ReplicationStream, lsn_of
from driftstream.engine.connectors.postgres_sink import PostgresSink, read_table
from driftstream.engine.connectors.postgres_source import PROGRESS_TABLE, PostgresSource, commit_lsn_of
from driftstream.engine.connectors.row_changes import Delete, Insert, Truncate, Update
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink
from tests.conftest import flow_actors
from tests.status_wait import kill_after


def _names() -> tuple:
    tag = uuid.uuid4().hex[:8]
    return f"t_{tag}", f"pub_{tag}", f"slot_{tag}"


def _sql(pg, *statements) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _read_all(reader, want: int, timeout_s: float = 30.0) -> list:
    out, deadline = [], time.time() + timeout_s
    while len(out) < want:
        assert time.time() < deadline, f"read {len(out)} of {want} changes"
        out += reader.read(1000)
        time.sleep(0.01)
    return out


def _slot_lsn(pg, slot: str) -> int:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        return lsn_of(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                   (slot,)).fetchone()[0])


def _drop_slot(pg, slot: str) -> None:
    _sql(pg, f"SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots WHERE slot_name = '{slot}' AND NOT active")


def test_changes_arrive_in_commit_order_and_a_replay_from_any_position_repeats_them(postgres):
    table, pub, slot = _names()
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY, name text, doc jsonb)")
    source = PostgresSource(postgres.dsn, pub, slot, tables=[table])
    assert source.partitions() == 1  # creates the publication and the slot
    _sql(postgres, f"INSERT INTO {table} VALUES (1, 'a', '{{\"x\": 1}}'), (2, 'b', null)",
         f"UPDATE {table} SET name = 'c' WHERE id = 1", f"DELETE FROM {table} WHERE id = 2", f"TRUNCATE {table}",
         f"INSERT INTO {table} VALUES (3, 'd', '[]')")
    reader = source.open(0, source_id=4)
    try:
        items = _read_all(reader, 6)
        payloads = [p for _, p in items]
        assert payloads == [Insert(f"public.{table}", {"id": 1, "name": "a", "doc": {"x": 1}}),
                            Insert(f"public.{table}", {"id": 2, "name": "b", "doc": None}),
                            Update(f"public.{table}", {"id": 1, "name": "c", "doc": {"x": 1}}),
                            Delete(f"public.{table}", {"id": 2}), Truncate(f"public.{table}"),
                            Insert(f"public.{table}", {"id": 3, "name": "d", "doc": []})]
        metas = [m for m, _ in items]
        assert metas == sorted(metas) and len({m[3] for m in metas}) == 6
        assert [m[1:3] for m in metas] == [(4, 0)] * 6
        assert metas[0][3] & 0xFFFFFFFF == 0 and metas[1][3] & 0xFFFFFFFF == 1  # one transaction, two changes
        assert abs(metas[0][0] - time.time() * 1000) < 60_000  # commit times, epoch ms
        positions = [(m[3], m[0]) for m in metas]
    finally:
        reader.close()
    for k in (0, 1, 3, 5):  # mid-transaction, at a transaction's start, the last
        replay = source.open(0, source_id=4, start=positions[k])
        try:
            assert _read_all(replay, 6 - k) == items[k:]
        finally:
            replay.close()
    _drop_slot(postgres, slot)


def test_the_slot_moves_to_committed_positions_only_and_a_slot_past_the_snapshot_is_refused(postgres):
    table, pub, slot = _names()
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    source = PostgresSource(postgres.dsn, pub, slot, tables=[table])
    source.partitions()
    before = _slot_lsn(postgres, slot)
    for i in range(5):
        _sql(postgres, f"INSERT INTO {table} VALUES ({i})")
    reader = source.open(0, 0)
    try:
        items = _read_all(reader, 5)
        time.sleep(1.2)
        reader.read(10)
        assert _slot_lsn(postgres, slot) == before  # read, but no snapshot committed: nothing confirmed
        hook = source.commit_hook()
        hook.submit({0: items[3][0][3]})  # a committed snapshot whose next change is the 4th
        hook.close(timeout_s=10)
        assert hook.commits == 1, hook.status()
        deadline = time.time() + 10
        while _slot_lsn(postgres, slot) != commit_lsn_of(items[3][0][3]):
            assert time.time() < deadline, (_slot_lsn(postgres, slot), items[3][0])
            reader.read(10)
            time.sleep(0.1)
    finally:
        reader.close()
    with pytest.raises(FlowError, match="past the position the flow resumes from"):
        source.open(0, 0, start=(items[1][0][3], items[1][0][0]))
    replay = source.open(0, 0, start=(items[3][0][3], items[3][0][0]))  # the committed one still replays
    try:
        assert [p for _, p in _read_all(replay, 2)] == [p for _, p in items[3:]]
    finally:
        replay.close()
    _drop_slot(postgres, slot)


def test_an_idle_source_ticks_its_time_forward_through_the_wal_and_a_replay_reads_the_same_ticks(postgres):
    table, pub, slot = _names()
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    source = PostgresSource(postgres.dsn, pub, slot, tables=[table], tick_interval=0.2)
    source.partitions()
    _sql(postgres, f"INSERT INTO {table} VALUES (1)")
    reader = source.open(0, 0)
    try:
        (first,) = _read_all(reader, 1)
        assert reader.bound() == (first[0][0], 0, 0, ((first[0][3] >> 32) + 1 << 32) - 1)  # past it, below the next commit
        time.sleep(0.6)  # idle: a tick or two
        deadline = time.time() + 10
        while reader.bound()[0] <= first[0][0]:
            assert time.time() < deadline, reader.fetch_state()
            reader.read(10)
            time.sleep(0.05)
        assert reader.ticks_sent >= 1
        ticked = reader.bound()
        _sql(postgres, f"INSERT INTO {table} VALUES (2)")
        (second,) = _read_all(reader, 1)
        assert second[0][:4] > ticked and second[0][0] >= ticked[0]
    finally:
        reader.close()
    replay = source.open(0, 0, start=(first[0][3], first[0][0]))
    try:
        got = []
        while len(got) < 2:
            got += replay.read(10)
        assert got == [first, second]  # the same times: the ticks are in the WAL
    finally:
        replay.close()
    _drop_slot(postgres, slot)


def test_what_the_server_lacks_is_said_before_the_run(postgres):
    table, pub, slot = _names()
    with pytest.raises(FlowError, match="no publication"):
        PostgresSource(postgres.dsn, pub, slot).partitions()
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)", f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    with pytest.raises(FlowError, match=r"no replication slot .*\(create_slot=False\)"):
        PostgresSource(postgres.dsn, pub, slot, create_slot=False).partitions()
    with pytest.raises(FlowError, match="a slot name is"):
        PostgresSource(postgres.dsn, pub, "Bad-Slot")


def _writer(pg, table: str, stop: threading.Event, seed: int) -> None:
    """Inserts, updates and deletes of 40 ids in transactions of 1-5 statements, until told to stop."""
    rng = random.Random(seed)
    with psycopg.connect(pg.dsn) as conn:
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rng.randint(1, 5)):
                    i = rng.randrange(40)
                    op = rng.random()
                    if op < 0.5:
                        conn.execute(f"INSERT INTO {table} VALUES (%s, %s, 1) ON CONFLICT (id) DO UPDATE "
                                     f"SET v = EXCLUDED.v, n = {table}.n + 1", (i, f"v{rng.randrange(1000)}"))
                    elif op < 0.8:
                        conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (i,))
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (i,))
            time.sleep(0.003)


def test_a_flow_keeps_a_copy_of_a_changing_table_exact_through_kills(ray_session, postgres, tmp_path):
    table, pub, slot = _names()
    copy = f"{table}_copy"
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n int)", f"CREATE TABLE {copy} (id int PRIMARY KEY, v text, n int)")
    name = f"pgcdc-{uuid.uuid4().hex[:6]}"
    flow = Flow(name)
    changes = flow.source(PostgresSource(postgres.dsn, pub, slot, tables=[table]), name="changes")
    changes.key_by(lambda c: c.row["id"], name="by_id").sink(PostgresSink(postgres.dsn, copy, mode="upsert", key=["id"]))
    stop = threading.Event()
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    writer = threading.Thread(target=_writer, args=(postgres, table, stop, 7), daemon=True)
    try:
        writer.start()
        deadline = time.time() + 120
        for victim in (f"{name}/changes/0", f"{name}/by_id/1"):  # the stream's reader, then a sink's stage
            kill_after(handle, victim, handle.status().get("released", 0) + 200)
        time.sleep(1.0)
        stop.set()
        writer.join(timeout=10)
        expected = read_table(postgres.dsn, table, order_by="id")
        while read_table(postgres.dsn, copy, order_by="id") != expected:
            assert time.time() < deadline, (len(read_table(postgres.dsn, copy)), len(expected))
            time.sleep(0.2)
        assert len(expected) > 10
        assert _slot_lsn(postgres, slot) > 0
    finally:
        stop.set()
        if flow_actors(name + "/"):
            handle.stop(timeout=60)
    _drop_slot(postgres, slot)


@pytest.mark.parametrize("form", ["key=value", "uri"])
def test_a_dsn_in_either_form_opens_the_replication_stream(postgres, form):
    table, pub, slot = _names()
    dsn = postgres.dsn if form == "key=value" else f"postgresql://{postgres.user}@127.0.0.1:{postgres.port}/postgres?connect_timeout=10"
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    source = PostgresSource(dsn, pub, slot, tables=[table], retry_s=5)
    source.partitions()
    _sql(postgres, f"INSERT INTO {table} VALUES (1)")
    reader = source.open(0, 0)
    try:
        assert [p for _, p in _read_all(reader, 1)] == [Insert(f"public.{table}", {"id": 1})]
    finally:
        reader.close()
    _drop_slot(postgres, slot)


def test_a_slot_still_held_by_a_closing_stream_is_waited_for_and_a_refusal_says_the_servers_reason(postgres):
    """A replay opened while the walsender of the reader before still holds the slot (a close
    or a kill a moment earlier; seen under load) starts once the slot is free; a refusal for
    another reason is a ReplicationError with the server's message."""
    table, pub, slot = _names()
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    source = PostgresSource(postgres.dsn, pub, slot, tables=[table])
    source.partitions()
    options = {"proto_version": "1", "publication_names": pub}
    first = ReplicationStream(postgres.dsn, slot, options)
    threading.Timer(0.5, first.close).start()  # the slot is active for ~0.5 s more
    started = time.monotonic()
    second = ReplicationStream(postgres.dsn, slot, options, timeout_s=20)
    try:
        assert time.monotonic() - started >= 0.4  # it waited for the slot, then started
    finally:
        second.close()
    with pytest.raises(ReplicationError, match="does not exist"):
        ReplicationStream(postgres.dsn, slot + "_missing", options, timeout_s=5)
    _drop_slot(postgres, slot)


def _wal_now(pg) -> int:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        return lsn_of(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _slot_lsns(pg, slot: str) -> tuple:
    """(the server's WAL position, the slot's confirmed_flush_lsn, its restart_lsn)."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        return tuple(map(lsn_of, conn.execute("SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text, restart_lsn::text "
                                              "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()))


def _busy_writer(pg, table: str, stop: threading.Event) -> None:
    """About 1.5 MB of WAL a second into a table the publication does not hold."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute(f"INSERT INTO {table} (pad) SELECT repeat(md5(random()::text), 10) FROM generate_series(1, 200)")
            time.sleep(0.05)


@pytest.mark.parametrize("tick_interval", [0.2, None])  # the WAL end from ticks' commits, and from keepalives alone
def test_the_slot_of_an_idle_source_on_a_busy_database_follows_the_snapshots_and_replays_exactly(postgres, tick_interval):
    table, pub, slot = _names()
    busy = f"{table}_busy"
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)", f"CREATE TABLE {busy} (id serial, pad text)")
    source = PostgresSource(postgres.dsn, pub, slot, tables=[table], tick_interval=tick_interval)
    source.partitions()
    _sql(postgres, f"INSERT INTO {table} VALUES (1)")
    hook, reader = source.commit_hook(), source.open(0, 0)
    stop = threading.Event()
    writer = threading.Thread(target=_busy_writer, args=(postgres, busy, stop), daemon=True)
    try:
        (first,) = _read_all(reader, 1)
        samples, t0, next_snapshot = [], time.time(), 0.0  # (seconds, WAL position, confirmed)
        writer.start()
        while time.time() < t0 + 4:
            assert reader.read(10) == []  # the published table stays idle
            if time.time() >= next_snapshot:  # a committed snapshot every 0.3 s, as a flow's driver tells it
                hook.submit({0: reader.position()[0]})
                next_snapshot = time.time() + 0.3
                now, confirmed, _ = _slot_lsns(postgres, slot)
                samples.append((time.time() - t0, now, confirmed))
            time.sleep(0.02)
        stop.set()
        writer.join(timeout=10)
        written = samples[-1][1] - samples[0][1]
        assert written > 3_000_000, written
        # The slot keeps about a snapshot interval plus a confirmation (1 s) of WAL, not all that was written
        checked = 0
        for t, now, confirmed in samples:
            before = [lsn for s, lsn, _ in samples if s <= t - 2.5]
            if before:
                checked += 1
                assert confirmed >= max(before), (t, (now - confirmed) / 1e6, written / 1e6, reader.fetch_state())
        assert checked >= 3, samples
        end, deadline = _wal_now(postgres), time.time() + 15
        checkpointed = 0.0
        while True:
            if time.time() > checkpointed + 1:
                # logs the running transactions: the slot's restart_lsn moves to such a record once it is
                # confirmed past it; again each second (one checkpoint's record came before WAL the server
                # wrote after it: 1.2 MB behind once, on a loaded machine)
                _sql(postgres, "CHECKPOINT")
                checkpointed = time.time()
            reader.read(10)
            hook.submit({0: reader.position()[0]})
            now, confirmed, restart = _slot_lsns(postgres, slot)
            if confirmed >= end and now - restart < 1_000_000:
                break
            assert time.time() < deadline, ((now - confirmed) / 1e6, (now - restart) / 1e6, reader.fetch_state())
            time.sleep(0.1)
        idle_position = reader.position()
        assert commit_lsn_of(idle_position[0]) >= end
        hook.submit({0: idle_position[0]})
        hook.close(timeout_s=10)
        _sql(postgres, f"INSERT INTO {table} VALUES (2)")
        (second,) = _read_all(reader, 1)
    finally:
        stop.set()
        reader.close()
    with pytest.raises(FlowError, match="past the position the flow resumes from"):  # the slot did move
        source.open(0, 0, start=(first[0][3] + 1, first[0][0]))
    replay = source.open(0, 0, start=idle_position)  # from the snapshot taken while idle: the later change, once
    try:
        assert _read_all(replay, 1) == [second]
        time.sleep(0.5)
        assert replay.read(10) == []
    finally:
        replay.close()
    _drop_slot(postgres, slot)


def test_a_flow_whose_tables_are_idle_lets_its_slot_move_and_resumes_exactly(ray_session, postgres, tmp_path):
    table, pub, slot = _names()
    busy, log_table = f"{table}_busy", f"{table}_log"
    _sql(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY)", f"CREATE TABLE {busy} (id serial, pad text)",
         f"CREATE TABLE {log_table} (id int)")
    name = f"pgidle-{uuid.uuid4().hex[:6]}"

    def start(**options):
        flow = Flow(name)
        flow.source(PostgresSource(postgres.dsn, pub, slot, tables=[table], tick_interval=0.2), name="changes").map(
            lambda c: {"id": c.row["id"]}, name="ids").sink(PostgresSink(postgres.dsn, log_table))  # append: a repeat shows
        return flow.start(guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"), **options)

    def logged(want: int, deadline: float) -> list:
        while len(rows := read_table(postgres.dsn, log_table, order_by="id")) < want:
            assert time.time() < deadline, rows
            time.sleep(0.1)
        time.sleep(1.0)  # a repeat would land by now
        return [r["id"] for r in read_table(postgres.dsn, log_table, order_by="id")]

    deadline = time.time() + 120
    handle = start()
    stop = threading.Event()
    try:
        _sql(postgres, *(f"INSERT INTO {table} VALUES ({i})" for i in range(1, 6)))
        assert logged(5, deadline) == [1, 2, 3, 4, 5]
        writer = threading.Thread(target=_busy_writer, args=(postgres, busy, stop), daemon=True)
        writer.start()
        time.sleep(1.2)  # ~2 MB of WAL the source does not read, over four snapshot intervals
        stop.set()
        writer.join(timeout=10)
        end, moved_by = _wal_now(postgres), time.time() + 20
        while _slot_lsns(postgres, slot)[1] < end:  # the idle source's snapshots move the slot past the busy table's WAL
            assert time.time() < moved_by, (_slot_lsns(postgres, slot), end)
            time.sleep(0.1)
    finally:
        stop.set()
        handle.stop(timeout=60)
    _sql(postgres, *(f"INSERT INTO {table} VALUES ({i})" for i in range(6, 9)))
    handle = start(resume=True)
    try:
        assert logged(8, deadline) == list(range(1, 9))
    finally:
        handle.stop(timeout=60)
    _drop_slot(postgres, slot)
