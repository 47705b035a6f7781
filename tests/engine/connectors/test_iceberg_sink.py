"""IcebergSink through pyiceberg, a SQL catalog on SQLite and a local warehouse: one Iceberg
snapshot per commit with the partition's t_last in its summary, so a recovery neither loses
nor repeats a row."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.iceberg_sink import IcebergSink
from driftstream.engine.testing import MemorySource, PacedSource, wait_for_actor
from driftstream.examples.inverted_index.ground_truth import reference_changes
from driftstream.examples.inverted_index.pipeline import build
from driftstream.ordering.meta import Meta
from tests.conftest import flow_actors

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]


def _docs(n: int) -> list:
    return [{"page_id": i, "text": " ".join(WORDS[(i * j) % len(WORDS)] + str(j % 7) for j in range(1, 12))} for i in range(n)]


@pytest.fixture
def catalog(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    SqlCatalog("default", **props).create_namespace("index")
    return props


def _changes_table(catalog: dict) -> str:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    name = f"index.changes_{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("op", pa.string()), ("word", pa.string()), ("page_id", pa.int64()), ("positions", pa.list_(pa.int64())),
                        ("df", pa.int64())])
    SqlCatalog("default", **catalog).create_table(name, schema=schema)
    return name


def _rows(catalog: dict, table: str) -> list:
    from pyiceberg.catalog.sql import SqlCatalog

    rows = SqlCatalog("default", **catalog).load_table(table).scan().to_arrow().to_pylist()
    return [{k: v for k, v in r.items() if v is not None} for r in rows]


def _key(change: dict) -> tuple:
    return (change["word"], change["page_id"], change["op"], tuple(change.get("positions") or ()), change["df"])


def test_the_simulator_appends_the_reference_changes(catalog):
    table = _changes_table(catalog)
    docs = _docs(60)
    build(MemorySource(docs, partitions=2), IcebergSink(table, catalog, commit_interval_s=0), name="ice-sim").run(
        runtime="simulator", parallelism=2, seed=2)
    assert Counter(map(_key, _rows(catalog, table))) == Counter(map(_key, reference_changes(docs)))


def test_a_missing_table_and_an_element_that_does_not_fit_say_so(catalog):
    with pytest.raises(ValueError, match="does not exist in catalog 'default': create it first"):
        build(MemorySource(_docs(2)), IcebergSink("index.nope", catalog), name="ice-missing").run(runtime="simulator")
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    SqlCatalog("default", **catalog).create_table("index.narrow", schema=pa.schema([("word", pa.string())]))
    with pytest.raises(Exception, match=r"element \{'op': 'add'.* has 'op', 'page_id', 'positions', 'df', which 'index.narrow' does not have"):
        build(MemorySource(_docs(2)), IcebergSink("index.narrow", catalog), name="ice-narrow").run(runtime="simulator")


def _bundle(page: int, n: int) -> Bundle:
    return Bundle([(Meta(page * 100 + i, 0, 0, page * 100 + i), {"op": "add", "word": f"w{i}", "page_id": page, "positions": [i], "df": 1})
                   for i in range(n)])


def _expire_all_but_the_current(catalog: dict, table: str) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    t = SqlCatalog("default", **catalog).load_table(table)
    current = t.current_snapshot().snapshot_id
    t.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in t.snapshots() if s.snapshot_id != current]).commit()


def test_t_last_outlives_expired_snapshots_and_a_cut_history_without_it_fails_loudly(catalog):
    """Partition 0 commits, then partition 1 twice; every snapshot but the newest (partition
    1's) is expired. A recovering partition 0 still finds its t_last (at bc7b6d0: None, and the
    replay appended its rows again); a table that says it nowhere fails the recovery."""
    table = _changes_table(catalog)
    sink = IcebergSink(table, catalog, commit_interval_s=0, name="changes")
    zero, one = sink.open(0, 2), sink.open(1, 2)
    zero.write(_bundle(1, 5))
    one.write(_bundle(2, 3))
    one.write(_bundle(3, 4))
    _expire_all_but_the_current(catalog, table)

    again = IcebergSink(table, catalog, commit_interval_s=0, name="changes")
    assert again.open(0, 2).t_last() == _bundle(1, 5).t_last
    assert again.open(1, 2).t_last() == _bundle(3, 4).t_last
    replay = again.open(0, 2)
    replay.write(_bundle(1, 5).after(replay.t_last()))  # the replay of what partition 0 holds: nothing new
    assert len(_rows(catalog, table)) == 12

    from pyiceberg.catalog.sql import SqlCatalog

    t = SqlCatalog("default", **catalog).load_table(table)
    with t.transaction() as txn:  # a table written before the property: only the expired snapshot said it
        txn.remove_properties("driftstream.t_last.0")
    _expire_all_but_the_current(catalog, table)
    with pytest.raises(RuntimeError) as err:
        IcebergSink(table, catalog, name="changes").open(0, 2).t_last()
    text = str(err.value)
    assert f"sink 'changes' cannot tell what partition 0 of Iceberg table {table!r} holds" in text
    assert "no property 'driftstream.t_last.0'" in text and "would append the partition's rows again" in text
    assert IcebergSink(table, catalog).open(1, 2).t_last() == _bundle(3, 4).t_last  # its own commit is the newest


def test_the_index_exactly_once_with_a_stateful_kill(ray_session, catalog, tmp_path):
    import ray

    table = _changes_table(catalog)
    docs = _docs(400)
    name = f"ice-{uuid.uuid4().hex[:6]}"
    sink = IcebergSink(table, catalog, commit_interval_s=0.2)
    # 160 docs/s: 2.5 s of input, ~4,100 changes; the kill at 1,500 released leaves over half to come.
    handle = build(PacedSource(docs, rate=160, partitions=2), sink, name=name).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 120
        while handle.status().get("released", 0) < 1500:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        ray.kill(wait_for_actor(f"{name}/by_word/1", timeout=30), no_restart=True)
        while not handle.status().get("recoveries"):
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        result = handle.wait(timeout=180)
    finally:
        if flow_actors(name + "/"):
            handle.stop(timeout=60)
    rows = _rows(catalog, table)
    assert Counter(map(_key, rows)) == Counter(map(_key, reference_changes(docs)))  # each change once
    assert result.metrics.released and len(rows) == len(reference_changes(docs))


def _block_data_dir(catalog: dict, table: str) -> tuple:
    """The table's data directory swapped for a file: writing a Parquet file there fails
    (NotADirectoryError), as a warehouse out of reach does. Returns ``(data dir, put back)``."""
    import os
    from pyiceberg.catalog.sql import SqlCatalog

    data = SqlCatalog("default", **catalog).load_table(table).location().removeprefix("file://") + "/data"
    os.rename(data, data + ".away")
    with open(data, "w"):
        pass

    def put_back() -> None:
        os.remove(data)
        os.rename(data + ".away", data)

    return data, put_back


def test_a_warehouse_out_of_reach_for_a_while_is_retried_and_writes_each_row_once(catalog):
    """At bc7b6d0 a commit failing for any reason but a lost race failed the run at once (the
    OSError as it was); now the sinks' retrying write policy retries it within ``retry_s``,
    and past it fails naming the sink, the table, the setting and the error."""
    import threading

    table = _changes_table(catalog)
    part = IcebergSink(table, catalog, commit_interval_s=0, name="changes", retry_s=30).open(0, 1)
    part.write(_bundle(1, 5))
    _, put_back = _block_data_dir(catalog, table)
    threading.Timer(1.0, put_back).start()
    part.write(_bundle(2, 3))
    assert part.retrying.retries >= 1
    assert len(_rows(catalog, table)) == 8 and part.t_last() == _bundle(2, 3).t_last

    short = IcebergSink(table, catalog, commit_interval_s=0, name="changes", retry_s=0.5).open(0, 1)
    _, put_back = _block_data_dir(catalog, table)
    try:
        with pytest.raises(ConnectionError) as err:
            short.write(_bundle(3, 2))
    finally:
        put_back()
    assert str(err.value).startswith(f"sink 'changes': writes to {table!r} (partition 0) failed for 0.5 s (IcebergSink retry_s): "), err.value
    assert len(_rows(catalog, table)) == 8


def test_a_catalog_out_of_reach_is_named_with_its_address_and_what_to_check():
    """Before: requests' or SQLAlchemy's own error, naming neither the sink nor the catalog."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    for catalog, address in (({"type": "rest", "uri": f"http://127.0.0.1:{port}"}, f"http://127.0.0.1:{port}"),
                             ({"type": "sql", "uri": f"postgresql+psycopg://u:pw@127.0.0.1:{port}/x", "warehouse": "file:///nowhere"},
                              f"postgresql+psycopg://u:***@127.0.0.1:{port}/x")):
        began = time.monotonic()
        with pytest.raises(ConnectionError) as err:
            IcebergSink("index.changes", catalog, name="changes").check(1)
        assert time.monotonic() - began < 10
        text = str(err.value)
        assert text.startswith(f"sink 'changes': cannot reach Iceberg catalog 'default' at {address} ("), text
        assert "is running at that address" in text and ":pw@" not in text, text
