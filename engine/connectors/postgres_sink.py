"""PostgresSink: released elements as rows of a PostgreSQL table, exactly once.

Each barrier writes its rows and its ``t_last`` (the Meta of its last row) in one
transaction: the rows go to the table, ``t_last`` to a progress table the sink owns,
keyed by table and sink partition. After a failure the barrier reads ``t_last`` back
and drops the replayed output at or before it, so no row is written twice and none is
lost, with no two-phase commit: a transaction either holds the rows and their
``t_last`` or neither.

``mode="append"`` adds every element as a row (``COPY``). ``mode="upsert"`` keeps one
row per ``key`` (its latest element in t order: ``INSERT ... ON CONFLICT DO UPDATE``),
a materialized view that is exact at every commit; the table needs a primary key or a
unique constraint on exactly the ``key`` columns. An upsert applies a table's changes
(:mod:`.row_changes`, what :class:`~.postgres_source.PostgresSource` emits) as they are: an
insert or update writes its row's columns (an update that changes the key deletes the old
key's row), a delete removes its key's row, a truncate empties the table. A transaction writes only each key's last state.

An element is a dict (column -> value), a dataclass, or a tuple in the order of
``columns``. ``columns``: the columns written (default: every column of the table); a
dict may leave some out (NULL) but may not name others. Dicts and lists go to ``json``
and ``jsonb`` columns as JSON.

A transaction holds at most ``max_rows`` rows, and commits come at most every
``commit_interval_s`` (what arrives meanwhile joins the next one): fewer, larger
transactions at the cost of up to that much latency.

>>> flow.source(src).key_by(word).stateful_map(count).sink(                  # doctest: +SKIP
...     PostgresSink("host=db dbname=app user=app", "word_counts", mode="upsert", key=["word"]))
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import Any, Optional, Sequence, Union

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.json_payloads import as_fields, json_default
from driftstream.engine.model.connectors import Sink, SinkPartition
from driftstream.engine.connectors.retrying_writer import RetryingWriter, RetryPolicy, WriteErrors
from driftstream.engine.connectors.row_changes import Delete, RowChange, Truncate, Update
from driftstream.engine.model.errors import FlowError, short_repr
from driftstream.ordering.meta import Meta, meta_from_json, meta_to_json

log = logging.getLogger(__name__)

MODES = ("append", "upsert")

#: The table of each sink partition's ``t_last``, created in the sink table's schema if missing.
PROGRESS_TABLE = "driftstream_sink_progress"

_JSON_TYPES = ("json", "jsonb")


def _quote(name: str) -> str:
    """A SQL identifier, quoted (``"my table"``); a dotted name quotes each part."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def _mask(dsn: str) -> str:
    """``dsn`` with its password shown as ``***``: a URI's (``user:password@``, or a
    ``password=`` parameter) or a keyword DSN's ``password=``, a quoted one whole.

    >>> _mask("host=db password='two words' user=u")
    'host=db password=*** user=u'
    >>> _mask("postgresql://u:pw@db/x?password=p2&sslmode=require")
    'postgresql://u:***@db/x?password=***&sslmode=require'
    """
    uri = "://" in dsn
    if uri:
        dsn = re.sub(r"(://[^:/@]+:)([^@]+)@", r"\1***@", dsn)
    # A quoted value runs to its closing quote (backslash escapes; to the end if unclosed);
    # a bare one to a space, or in a URI to the next parameter.
    bare = r"[^\s&#]+" if uri else r"\S+"
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*(?:'|$)|" + bare + ")", r"\1***", dsn, flags=re.IGNORECASE)


class PostgresSink(Sink):
    """Write released elements to ``table``, exactly once with the flow's exactly-once.

    ``mode``: ``"append"`` or ``"upsert"`` (with ``key``, the columns of a unique
    constraint). ``commit_interval_s``: the least time between two commits of a partition
    (default 0: a transaction per released bundle, which already holds all that was released
    together; a wait costs ~1.5x itself in latency); ``max_rows``: the most rows a transaction holds. ``retry_s``: how long
    a write the server fails (connection lost, server restarting) is retried, reconnecting
    with backoff, before the run fails with the error; a retry first reads ``t_last``
    back, so nothing is written twice.
    """

    def __init__(self, dsn: str, table: str, mode: str = "append", key: Optional[Sequence[str]] = None,
                 columns: Optional[Sequence[str]] = None, commit_interval_s: float = 0.0, max_rows: int = 10_000,
                 retry_s: float = 60.0, name: Optional[str] = None) -> None:
        super().__init__(name or table.replace(".", "_"))
        if mode not in MODES:
            raise FlowError(f"PostgresSink({table!r}) mode must be 'append' or 'upsert', not {mode!r}")
        if mode == "upsert" and not key:
            raise FlowError(f"PostgresSink({table!r}, mode='upsert') needs key=[...]: the columns of the table's primary key or unique constraint")
        if mode == "append" and key:
            raise FlowError(f"PostgresSink({table!r}) key= is for mode='upsert'; an append sink adds every element")
        if not commit_interval_s >= 0 or not isinstance(max_rows, int) or max_rows < 1:
            raise FlowError(f"PostgresSink({table!r}): commit_interval_s must be >= 0 and max_rows an int >= 1")
        self.dsn, self.table, self.mode = dsn, table, mode
        self.key = list(key or [])
        self.columns = list(columns) if columns is not None else None
        self.commit_interval_s, self.max_rows, self.retry_s = commit_interval_s, max_rows, retry_s

    def open(self, partition: int, partitions: int) -> SinkPartition:
        return _PostgresSinkPartition(self, partition)

    def check(self, partitions: int) -> None:
        """Before the run: the server answers, the table exists and takes the columns (and
        for upsert has a unique constraint on ``key``), and the progress table is there."""
        with self._connect() as conn:
            _TableShape.read(conn, self)
            _ensure_progress_table(conn, self.table)

    def _connect(self, application_name: str = "driftstream"):
        import psycopg

        try:
            return psycopg.connect(self.dsn, connect_timeout=10, application_name=application_name)
        except psycopg.OperationalError as exc:
            raise ValueError(f"sink {self.name!r}: cannot connect to PostgreSQL at {_mask(self.dsn)}: {str(exc).strip()}") from exc

    def __repr__(self) -> str:
        return f"PostgresSink({_mask(self.dsn)!r}, {self.table!r}, mode={self.mode!r}{f', key={self.key!r}' if self.key else ''})"


@dataclasses.dataclass
class _TableShape:
    """What the sink writes: the columns, which of them take JSON, and the SQL."""

    columns: list
    json_columns: set
    #: where an upsert's key columns are in ``columns``, and ``columns`` as a tuple (per row, once)
    key_positions: tuple = ()
    column_names: tuple = ()

    @classmethod
    def read(cls, conn: Any, sink: PostgresSink) -> "_TableShape":
        schema, _, name = sink.table.rpartition(".")
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable = 'YES' OR column_default IS NOT NULL FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = COALESCE(NULLIF(%s, ''), current_schema()) ORDER BY ordinal_position",
            (name, schema)).fetchall()
        if not rows:
            raise ValueError(f"sink {sink.name!r}: table {sink.table!r} does not exist: create it first (CREATE TABLE {sink.table} (...))")
        types = {c: t for c, t, _ in rows}
        columns = sink.columns if sink.columns is not None else [c for c, _, _ in rows]
        unknown = [c for c in columns + sink.key if c not in types]
        if unknown:
            raise ValueError(f"sink {sink.name!r}: table {sink.table!r} has no column {', '.join(map(repr, unknown))} "
                             f"(it has {', '.join(types)}): fix columns=/key= or the table")
        required = [c for c, _, optional in rows if not optional and c not in columns]
        if required:
            raise ValueError(f"sink {sink.name!r}: table {sink.table!r} needs {', '.join(map(repr, required))} (NOT NULL, no default), "
                             "which the sink does not write: add them to columns=")
        if sink.mode == "upsert" and not _has_unique(conn, sink.table, sink.key):
            raise ValueError(f"sink {sink.name!r}: an upsert needs a primary key or unique constraint on exactly {sink.key} "
                             f"in {sink.table!r}: ALTER TABLE {sink.table} ADD PRIMARY KEY ({', '.join(sink.key)})")
        unwritten_key = [k for k in sink.key if k not in columns]
        if unwritten_key:
            raise ValueError(f"sink {sink.name!r}: an upsert writes its key, but columns= leaves out {', '.join(map(repr, unwritten_key))}: add it")
        return cls(list(columns), {c for c in columns if types[c] in _JSON_TYPES}, tuple(columns.index(k) for k in sink.key), tuple(columns))


def _has_unique(conn: Any, table: str, key: list) -> bool:
    rows = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid", (_quote(table),)).fetchall()
    return any(sorted(cols) == sorted(key) for (cols,) in rows)


def _progress_name(table: str) -> str:
    schema, _, _ = table.rpartition(".")
    return f"{schema}.{PROGRESS_TABLE}" if schema else PROGRESS_TABLE


def _ensure_progress_table(conn: Any, table: str) -> None:
    create_if_missing(conn, f"CREATE TABLE IF NOT EXISTS {_quote(_progress_name(table))} (sink_table text NOT NULL, sink_partition int NOT NULL, "
                            "t_last jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_table, sink_partition))")


def create_if_missing(conn: Any, ddl: str) -> None:
    """Run a ``CREATE ... IF NOT EXISTS`` and commit it; another connection creating the same
    table at the same moment is no error (IF NOT EXISTS is not atomic)."""
    import psycopg

    try:
        conn.execute(ddl)
        conn.commit()
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        conn.rollback()


def _write_errors() -> WriteErrors:
    """A write the connection failed (lost, refused, the server restarting) is retried."""
    import psycopg

    return WriteErrors(transient=(psycopg.OperationalError,), failure=ConnectionError, setting="PostgresSink retry_s")


def _strip(exc: BaseException) -> str:
    return str(exc).strip()


class _PostgresSinkPartition(SinkPartition):
    """One sink partition's connection: each write is one or more transactions, each of
    rows and the ``t_last`` of its last row."""

    def __init__(self, sink: PostgresSink, partition: int) -> None:
        self.sink, self.partition = sink, partition
        self.conn: Any = None
        self.shape: Optional[_TableShape] = None
        self.last_commit = 0.0
        self.transactions = 0
        #: how the server lists this partition's connection (pg_stat_activity.application_name)
        self.application_name = f"driftstream-{sink.name}-{partition}"[:63]
        self._warned_old_key = False
        self.retrying = RetryingWriter(sink.name, f"{sink.table!r} (partition {partition})", RetryPolicy(sink.retry_s), _write_errors(),
                                       on_error=self._drop, describe=_strip)

    def _connection(self) -> Any:
        if self.conn is None or self.conn.closed:
            self.conn = self.sink._connect(self.application_name)
            self.shape = _TableShape.read(self.conn, self.sink)
            self.conn.commit()
            _ensure_progress_table(self.conn, self.sink.table)
        return self.conn

    def write(self, bundle: Bundle) -> None:
        # an element that does not fit fails at once
        if self.sink.mode == "append":
            rows = [self._row(meta, payload) for meta, payload in bundle.elements]
        else:
            rows = [self._upsert_action(meta, payload) for meta, payload in bundle.elements]
        self.retrying.write(bundle, rows, self._send, lambda _timeout_s: self.t_last())

    def _send(self, bundle: Bundle, rows: list) -> None:
        """``rows`` (the last ``len(rows)`` of the bundle's) in transactions of at most ``max_rows``."""
        import psycopg

        elements, size = bundle.elements, self.sink.max_rows
        try:
            for start in range(0, len(rows), size):
                self._commit(rows[start:start + size], elements[min(len(rows), start + size) - 1][0])
        except psycopg.OperationalError:
            raise  # the connection: lost, refused, the server restarting (the retrying writer's)
        except psycopg.Error as exc:  # the data: a constraint, a type the column refuses
            self._drop()
            raise ValueError(f"sink {self.sink.name!r}: PostgreSQL refused rows for {self.sink.table!r}: {str(exc).strip()}") from exc

    def _commit(self, rows: list, last_meta: tuple) -> None:
        wait = self.last_commit + self.sink.commit_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        conn = self._connection()
        shape, table = self.shape, _quote(self.sink.table)
        columns = ", ".join(map(_quote, shape.columns))
        with conn.transaction():
            with conn.cursor() as cur:
                if self.sink.mode == "append":
                    with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                        for row in rows:
                            copy.write_row(row)
                else:
                    _apply_upserts(cur, table, self.sink.key, shape.columns, rows)
                cur.execute(
                    f"INSERT INTO {_quote(_progress_name(self.sink.table))} (sink_table, sink_partition, t_last) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sink_table, sink_partition) DO UPDATE SET t_last = EXCLUDED.t_last, updated_at = now()",
                    (self.sink.table, self.partition, json.dumps(meta_to_json(last_meta))))
        self.last_commit = time.monotonic()
        self.transactions += 1

    def _row(self, meta: tuple, payload: Any, columns: Optional[list] = None) -> tuple:
        """An element as the values of ``columns`` (default: every column the sink writes)."""
        from psycopg.types.json import Jsonb

        shape = self.shape or self._shape()
        columns, json_columns = columns or shape.columns, shape.json_columns
        payload = as_fields(payload)
        if isinstance(payload, dict):
            extra = [k for k in payload if k not in columns]
            if extra:
                raise ValueError(f"sink {self.sink.name!r}: element {short_repr(payload)} at t={meta!r} has {', '.join(map(repr, extra))}, "
                                 f"which {self.sink.table!r} does not take (columns {columns})")
            values = [payload.get(c) for c in columns]
        elif isinstance(payload, (tuple, list)) and len(payload) == len(columns):
            values = list(payload)
        else:
            raise ValueError(f"sink {self.sink.name!r}: element {short_repr(payload)} at t={meta!r} is not a row of {self.sink.table!r}: "
                             f"give a dict, a dataclass or a tuple of {len(columns)} ({', '.join(columns)})")
        return tuple(Jsonb(v, dumps=_json_dumps) if c in json_columns and v is not None else v for c, v in zip(columns, values))

    def _upsert_action(self, meta: tuple, payload: Any) -> tuple:
        """What an element does to an upsert table: ``(key, columns, values, moved_from)`` to
        write a row's columns (``moved_from``: the key an update moved the row from, else None),
        ``(key, None, None, None)`` to delete the key's row, ``(None, None, None, None)`` to empty it."""
        if isinstance(payload, RowChange):
            if isinstance(payload, Truncate):
                return (None, None, None, None)
            shape = self.shape or self._shape()
            fields = payload.row
            missing = [k for k in self.sink.key if k not in fields]
            if missing:
                raise ValueError(f"sink {self.sink.name!r}: change {short_repr(payload)} at t={meta!r} has no key column "
                                 f"{', '.join(map(repr, missing))} of {self.sink.table!r}")
            key = tuple(fields[k] for k in self.sink.key)
            if isinstance(payload, Delete):
                return (key, None, None, None)
            moved_from = self._moved_from(meta, payload, key) if isinstance(payload, Update) else None
            if moved_from is not None and payload.old is not None:
                # REPLICA IDENTITY FULL: the old row holds the TOASTed values the new one left out
                fields = {**{c: payload.old[c] for c in payload.unchanged if c in payload.old}, **fields}
            columns = [c for c in shape.columns if c in fields]
            row = self._row(meta, {c: fields[c] for c in columns}, columns)
            return (key, tuple(columns), row, moved_from)
        shape = self.shape or self._shape()
        row = self._row(meta, payload)
        return (tuple(row[i] for i in shape.key_positions), shape.column_names, row, None)

    def _moved_from(self, meta: tuple, change: Update, key: tuple) -> Optional[tuple]:
        """The key an update moved its row from: the server sends the old key only when it
        changed (or the whole old row under ``REPLICA IDENTITY FULL``); None if it stayed."""
        old = change.old
        if old is None:
            return None
        if any(k not in old for k in self.sink.key):
            if not self._warned_old_key:  # a sink key that is not the source table's replica identity
                self._warned_old_key = True
                log.warning("sink %s: update %s at t=%r names its old key without %s, so a changed key of %s leaves its "
                            "old row: make key= the source table's primary key, or ALTER TABLE ... REPLICA IDENTITY FULL",
                            self.sink.name, short_repr(change), meta, self.sink.key, self.sink.table)
            return None
        old_key = tuple(old[k] for k in self.sink.key)
        return None if old_key == key else old_key

    def _shape(self) -> _TableShape:
        self._connection()
        return self.shape

    def t_last(self) -> Optional[Meta]:
        conn = self._connection()
        row = conn.execute(f"SELECT t_last FROM {_quote(_progress_name(self.sink.table))} WHERE sink_table = %s AND sink_partition = %s",
                           (self.sink.table, self.partition)).fetchone()
        conn.commit()
        return None if row is None else meta_from_json(row[0])

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # already broken
                pass
            self.conn = None

    def close(self) -> None:
        self._drop()


#: a key this transaction has not touched yet
_UNTOUCHED = object()


def _apply_upserts(cur: Any, table: str, key: list, all_columns: list, actions: list) -> None:
    """Apply ``(key, columns, values, moved_from)`` actions in order, as one transaction can:
    only each key's last state is written (a later update's columns over an earlier one's,
    for the columns a change left out), after a truncate if one came. An update that moved
    a row to a new key deletes the old key's row, and the new row takes the columns the
    change left out (unchanged TOASTed values) from the old row as the transaction found it."""
    latest: dict = {}  # key -> None (to delete) or (columns -> value, the key of the row that fills the rest)
    truncated = False
    for k, columns, values, moved_from in actions:
        if k is None and columns is None:
            latest.clear()
            truncated = True
        elif columns is None:
            latest[k] = None
        else:
            row = dict(zip(columns, values))
            if moved_from is None:
                before = latest.get(k)
                latest[k] = ({**before[0], **row}, before[1]) if before else (row, k)
            else:
                before = latest.get(moved_from, _UNTOUCHED)
                latest[moved_from] = None
                if before is _UNTOUCHED:
                    before = ({}, None if truncated else moved_from)
                base, origin = before or ({}, None)
                latest[k] = ({**base, **row}, origin)
    where = " AND ".join(f"{_quote(c)} = %s" for c in key)
    filled = set()
    for k, state in latest.items():  # read before any write: the rows as the transaction found them
        lacking = [] if state is None or state[1] in (None, k) else [c for c in all_columns if c not in state[0]]
        if lacking:
            found = cur.execute(f"SELECT {', '.join(_quote(c) + '::text' for c in lacking)} FROM {table} WHERE {where}", state[1]).fetchone()
            if found is not None:
                state[0].update(zip(lacking, found))  # as text: the server casts it back to the column's type
                filled.add(k)
    if truncated:
        cur.execute(f"DELETE FROM {table}")
    deletes = [k for k, state in latest.items() if state is None]
    if deletes:
        cur.executemany(f"DELETE FROM {table} WHERE {where}", deletes)
    by_columns: dict = {}
    for k, state in latest.items():
        if state is not None:
            by_columns.setdefault((tuple(state[0]), k in filled), []).append(tuple(state[0].values()))
    for (columns, _), rows in by_columns.items():
        updates = ", ".join(f"{_quote(c)} = EXCLUDED.{_quote(c)}" for c in columns if c not in key) or None
        cur.executemany(
            f"INSERT INTO {table} ({', '.join(map(_quote, columns))}) VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({', '.join(map(_quote, key))}) DO " + (f"UPDATE SET {updates}" if updates else "NOTHING"),
            rows)


def _json_dumps(value: Any) -> str:
    return json.dumps(value, default=json_default)


def read_table(dsn: str, table: str, order_by: Union[str, Sequence[str], None] = None) -> list:
    """Every row of ``table`` as a dict (for tests and examples), ordered by ``order_by``."""
    import psycopg
    from psycopg.rows import dict_row

    order = "" if order_by is None else " ORDER BY " + ", ".join(map(_quote, [order_by] if isinstance(order_by, str) else order_by))
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(f"SELECT * FROM {_quote(table)}{order}").fetchall()
