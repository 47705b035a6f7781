"""IcebergSink: released elements appended to an Apache Iceberg table, exactly once.

Each write of a sink partition is one Iceberg snapshot (an append, through ``pyiceberg``:
Arrow batches into Parquet files), and the snapshot's summary carries the partition's
``t_last`` (``driftstream.t_last.<partition>``): the rows and their ``t_last`` commit
together or not at all. The same commit sets a table property of that name, which outlives
the snapshot when ``expire_snapshots`` removes it. After a failure the barrier reads
``t_last`` back from the newest snapshot along the current one's parents that has it (the
history the table's data has, right after a rollback too); where expired snapshots cut that
history first, from the table property; with neither, the recovery fails rather than
write the rows again. It drops the replayed rows at or before ``t_last``.

Commits come at most every ``commit_interval_s`` (default 1 s; what arrives meanwhile
joins the next one): an Iceberg snapshot per second per partition, not per bundle.
Partitions commit concurrently; a commit that loses the race to another partition's
(Iceberg's optimistic concurrency) is retried on the refreshed table.

``catalog``: pyiceberg's catalog properties (any catalog it has: REST, Glue, Hive, SQL):

>>> IcebergSink("index.postings", {"uri": "sqlite:////data/catalog.db",           # doctest: +SKIP
...                                "warehouse": "file:///data/warehouse"})

An element is a dict (column -> value) or a dataclass; columns the table has and the
element lacks are null, keys the table lacks are an error that names the element.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping, Optional

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.json_payloads import as_fields
from driftstream.engine.connectors.postgres_sink import _mask
from driftstream.engine.model.connectors import Sink, SinkPartition
from driftstream.engine.connectors.retrying_writer import RetryingWriter, RetryPolicy, WriteErrors
from driftstream.engine.model.errors import FlowError, short_repr
from driftstream.ordering.meta import Meta, meta_from_json, meta_to_json

log = logging.getLogger(__name__)

#: The snapshot summary property of a sink partition's t_last (its index appended).
T_LAST_PROPERTY = "driftstream.t_last."

#: Commits that lose a race to another partition's, retried before the run fails.
MAX_CONFLICTS = 50


class IcebergSink(Sink):
    """Append released elements to the Iceberg table ``table`` (``namespace.name``) of the
    pyiceberg catalog ``catalog`` (its properties; ``catalog_name`` names it). The table
    must exist (its schema is the contract). ``commit_interval_s``: the least time between
    two commits of a partition. ``retry_s``: how long a commit the catalog or the warehouse
    fails (out of reach, a server error) is retried, with backoff, before the run fails with
    the error; a retry first reads ``t_last`` back, so nothing is written twice."""

    def __init__(self, table: str, catalog: Mapping[str, Any], catalog_name: str = "default", commit_interval_s: float = 1.0,
                 name: Optional[str] = None, retry_s: float = 60.0) -> None:
        super().__init__(name or table.replace(".", "_"))
        if "." not in table:
            raise FlowError(f"IcebergSink table is namespace.name, not {table!r}")
        if not commit_interval_s >= 0:
            raise FlowError(f"IcebergSink({table!r}) commit_interval_s must be >= 0, not {commit_interval_s!r}")
        self.table, self.catalog, self.catalog_name, self.commit_interval_s = table, dict(catalog), catalog_name, commit_interval_s
        self.retry_s = retry_s

    def load(self) -> Any:
        """The table, through a catalog made here (a catalog holds connections: one per process)."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        from driftstream.engine.connectors.iceberg_logs import quiet_concurrent_commit_warnings

        quiet_concurrent_commit_warnings()  # partitions racing to commit is expected here: pyiceberg's per-attempt warning to DEBUG
        try:
            return load_catalog(self.catalog_name, **self.catalog).load_table(self.table)
        except NoSuchTableError:
            raise ValueError(f"sink {self.name!r}: Iceberg table {self.table!r} does not exist in catalog {self.catalog_name!r}: "
                             "create it first (catalog.create_table(name, schema=...))") from None
        except _unreachable_errors() as exc:  # still an OSError: a write's retries take it as the outage it is
            raise ConnectionError(
                f"sink {self.name!r}: cannot reach Iceberg catalog {self.catalog_name!r} at {_mask(str(self.catalog.get('uri', '?')))} "
                f"({str(exc).strip()}): check that the catalog (its REST server, metastore or database) is running at that "
                "address, and the catalog properties (uri, credentials)") from exc

    def check(self, partitions: int) -> None:
        self.load()

    def open(self, partition: int, partitions: int) -> SinkPartition:
        return _IcebergSinkPartition(self, partition)

    def __repr__(self) -> str:
        return f"IcebergSink({self.table!r}, catalog={self.catalog_name!r})"


def write_errors() -> WriteErrors:
    """Which errors of a commit are retried: a lost race to another partition's commit (the
    table moved on; a conflict is refused whole) at once, on the refreshed table; an outage
    (the catalog's or the warehouse's connection, a server error, a commit whose outcome the
    catalog could not say) with backoff within ``retry_s``; refused credentials never."""
    from pyiceberg import exceptions as ice

    transient = (OSError, ice.ServiceUnavailableError, ice.ServerError, ice.TooManyRequestsError, ice.CommitStateUnknownException,
                 ice.WaitingForLockException)
    try:  # a SQL catalog's database gone (SQLAlchemy is its driver, there only)
        from sqlalchemy.exc import OperationalError

        transient += (OperationalError,)
    except ImportError:
        pass
    return WriteErrors(transient=transient, refused=(ice.UnauthorizedError, ice.ForbiddenError), conflicts=(ice.CommitFailedException,),
                       failure=ConnectionError, setting="IcebergSink retry_s")


def _unreachable_errors() -> tuple:
    """A catalog out of reach: a connection error (a REST catalog's ``requests`` errors are
    OSErrors), or a SQL catalog's database gone (SQLAlchemy is its driver, there only)."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:
        return (OSError,)
    return (OSError, OperationalError)


class _IcebergSinkPartition(SinkPartition):
    def __init__(self, sink: IcebergSink, partition: int) -> None:
        self.sink, self.partition = sink, partition
        self.key = f"{T_LAST_PROPERTY}{partition}"
        self._table: Any = None
        self.last_commit = 0.0
        self.commits = 0
        policy = RetryPolicy(sink.retry_s, max_conflicts=MAX_CONFLICTS)
        self.retrying = RetryingWriter(sink.name, f"{sink.table!r} (partition {partition})", policy, write_errors(), on_error=self._reload)

    def table(self) -> Any:
        if self._table is None:
            self._table = self.sink.load()
        return self._table

    def write(self, bundle: Bundle) -> None:
        elements = list(bundle.elements)
        if not elements:
            return
        data = self._arrow([self._row(meta, payload) for meta, payload in elements], elements)
        wait = self.last_commit + self.sink.commit_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.retrying.write(bundle, data, self._send, lambda _timeout_s: self.t_last())  # t_last refreshes the table
        self.last_commit = time.monotonic()
        self.commits += 1

    def _send(self, bundle: Bundle, data: Any) -> None:
        """One commit: the snapshot's summary and the table property (which outlives the
        snapshot's expiry) say ``t_last`` together with the rows, or none of them lands."""
        value = json.dumps(meta_to_json(bundle.elements[-1][0]))
        with self.table().transaction() as txn:
            txn.set_properties({self.key: value})
            txn.append(data, snapshot_properties={self.key: value})

    def _reload(self) -> None:
        """After a transient error: the table again, through a new catalog (its connection may be gone)."""
        self._table = None

    def _row(self, meta: tuple, payload: Any) -> dict:
        payload = as_fields(payload)
        if not isinstance(payload, dict):
            raise ValueError(f"sink {self.sink.name!r}: element {short_repr(payload)} at t={meta!r} is not a row: give a dict or a dataclass")
        return payload

    def _arrow(self, rows: list, elements: list) -> Any:
        import pyarrow as pa

        schema = self.table().schema().as_arrow()
        names = set(schema.names)
        for (meta, _), row in zip(elements, rows):
            extra = [k for k in row if k not in names]
            if extra:
                raise ValueError(f"sink {self.sink.name!r}: element {short_repr(row)} at t={meta!r} has {', '.join(map(repr, extra))}, "
                                 f"which {self.sink.table!r} does not have (columns {schema.names})")
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"sink {self.sink.name!r}: elements from t={elements[0][0]!r} do not fit {self.sink.table!r}: {exc}") from exc

    def t_last(self) -> Optional[Meta]:
        """From the newest snapshot back along its parents (the table's history, in commit
        order); where expired snapshots cut that history before one says it, from the table
        property. None only when the history is whole (back to the table's first snapshot)
        and says nothing was written."""
        table = self.table()
        table.refresh()
        snapshot = table.current_snapshot()
        while snapshot is not None:
            value = (snapshot.summary.additional_properties if snapshot.summary is not None else {}).get(self.key)
            if value is not None:
                return meta_from_json(json.loads(value))
            parent = None if snapshot.parent_snapshot_id is None else table.snapshot_by_id(snapshot.parent_snapshot_id)
            if parent is None:
                return self._t_last_before(table, snapshot)
            snapshot = parent
        return None  # no snapshot: nothing written

    def _t_last_before(self, table: Any, oldest: Any) -> Optional[Meta]:
        """The history ends at ``oldest`` and did not say this partition's ``t_last``. The
        table's first snapshot (sequence number 1): nothing written. Otherwise its parents were
        expired (pyiceberg's expiry clears the parent id, Java's leaves it dangling): the table
        property set by this partition's last commit, or an error, never None (a replay would
        append every row again). Format 1 tables number no snapshot: they cannot tell, None."""
        if oldest.parent_snapshot_id is None and oldest.sequence_number == 1:
            return None
        value = table.properties.get(self.key)
        if value is not None:
            return meta_from_json(json.loads(value))
        if oldest.parent_snapshot_id is None and not oldest.sequence_number:
            return None
        raise RuntimeError(
            f"sink {self.sink.name!r} cannot tell what partition {self.partition} of Iceberg table {self.sink.table!r} holds: "
            f"the snapshots before {oldest.snapshot_id} were expired before one saying it ({self.key!r} in its summary) was "
            f"found, and the table has no property {self.key!r} (each commit sets it: the table was written by an older "
            f"driftstream, or the property was removed), so a replay would append the partition's rows again. Set that "
            f"property to the partition's last t_last (its Meta as JSON) if you know it, or start over on an empty table")
