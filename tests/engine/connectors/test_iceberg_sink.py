"""IcebergSink through pyiceberg, a SQL catalog on SQLite and a local warehouse: one Iceberg
snapshot per commit with the partition's t_last in its summary, so a recovery neither loses
nor repeats a row."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from driftstream.engine.connectors.iceberg_sink import IcebergSink
from driftstream.engine.testing import MemorySource, PacedSource
from driftstream.examples.inverted_index.ground_truth import reference_changes
from driftstream.examples.inverted_index.pipeline import build
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


def test_the_index_exactly_once_with_a_stateful_kill(ray_session, catalog, tmp_path):
    import ray

    table = _changes_table(catalog)
    docs = _docs(400)
    name = f"ice-{uuid.uuid4().hex[:6]}"
    sink = IcebergSink(table, catalog, commit_interval_s=0.2)
    handle = build(PacedSource(docs, rate=80, partitions=2), sink, name=name).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 120
        while handle.status().get("released", 0) < 1500:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        ray.kill(ray.get_actor(f"{name}/by_word/1", namespace="driftstream"), no_restart=True)
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
