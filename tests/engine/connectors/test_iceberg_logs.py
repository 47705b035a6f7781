"""Two IcebergSink partitions committing to one table: the one that loses the race is
retried by pyiceberg without a WARNING line per attempt (its "Commit failed due to a
concurrent update, retrying" is DEBUG now), and every row lands once."""

from __future__ import annotations

import logging

import pytest

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.iceberg_logs import CONCURRENT_UPDATE, ConcurrentCommitToDebug
from driftstream.engine.connectors.iceberg_sink import IcebergSink
from driftstream.ordering.meta import Meta


@pytest.fixture
def table(tmp_path):
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    catalog = SqlCatalog("default", **props)
    catalog.create_namespace("ns")
    catalog.create_table("ns.rows", schema=pa.schema([("n", pa.int64())]))
    return props, catalog


def _bundle(first: int, n: int) -> Bundle:
    return Bundle([(Meta(t, 0, 0, t), {"n": t}) for t in range(first, first + n)])


def _concurrent_update_records(caplog) -> list:
    return [r for r in caplog.records if r.name == "pyiceberg.table" and str(r.msg).startswith(CONCURRENT_UPDATE)]


def test_a_lost_commit_race_is_retried_without_a_warning(table, caplog):
    props, catalog = table
    sink = IcebergSink("ns.rows", props, commit_interval_s=0, name="rows")
    first, second = sink.open(0, 2), sink.open(1, 2)
    first.table(), second.table()  # both hold the table as it is now
    with caplog.at_level(logging.WARNING):
        first.write(_bundle(1, 3))
        second.write(_bundle(10, 2))  # its table is stale: its first commit loses, pyiceberg retries it
    assert not _concurrent_update_records(caplog)
    assert sorted(r["n"] for r in catalog.load_table("ns.rows").scan().to_arrow().to_pylist()) == [1, 2, 3, 10, 11]


def test_the_warning_is_still_there_at_debug(table, caplog):
    props, _ = table
    sink = IcebergSink("ns.rows", props, commit_interval_s=0, name="rows")
    first, second = sink.open(0, 2), sink.open(1, 2)
    first.table(), second.table()
    with caplog.at_level(logging.DEBUG, logger="pyiceberg.table"):
        first.write(_bundle(1, 3))
        second.write(_bundle(10, 2))
    assert [r.levelname for r in _concurrent_update_records(caplog)] == ["DEBUG"]


def test_other_records_pass_unchanged():
    record = logging.LogRecord("pyiceberg.table", logging.WARNING, __file__, 1, "something else", (), None)
    assert ConcurrentCommitToDebug().filter(record) and record.levelno == logging.WARNING
