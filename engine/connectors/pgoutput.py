"""Decoding PostgreSQL's logical replication messages (the ``pgoutput`` plugin, protocol 1).

A transaction arrives as ``Begin``, its changes, ``Commit``, in commit order; a ``Relation``
message describes a table (its columns and their types) before the first change that needs
it. :class:`PgOutputDecoder` keeps the relations and turns each message into a
:class:`Begin`, a :class:`Commit`, a :class:`~.row_changes.RowChange`, a :class:`Message`
(``pg_logical_emit_message``, sent with the option ``messages``), or None (a message that
carries no data for a flow: relation, type, origin).

Values arrive as text. Booleans, integers, floats, ``numeric`` (as :class:`~decimal.Decimal`)
and ``json``/``jsonb`` (parsed) become Python values; every other type keeps PostgreSQL's text
form (timestamps as ``'2026-11-28 17:00:00+00'``, which PostgreSQL reads back as it wrote it).

>>> d = PgOutputDecoder()
>>> d.decode(b"R" + (16384).to_bytes(4, "big") + b"public\\0t\\0d" + (1).to_bytes(2, "big")
...          + b"\\x01id\\0" + (23).to_bytes(4, "big") + (0).to_bytes(4, "big", signed=True))
>>> d.decode(b"I" + (16384).to_bytes(4, "big") + b"N" + (1).to_bytes(2, "big") + b"t" + (2).to_bytes(4, "big") + b"42")
Insert(table='public.t', row={'id': 42})

Cost: O(bytes of the message), one Python call per column value.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Optional, Union

from driftstream.engine.connectors.row_changes import Delete, Insert, RowChange, Truncate, Update

#: Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
PG_EPOCH_US = 946_684_800_000_000


@dataclass(frozen=True)
class Begin:
    """A transaction starts: ``final_lsn`` is its commit record's LSN (unique, increasing in
    the stream), ``commit_ms`` its commit time in epoch milliseconds."""

    final_lsn: int
    commit_ms: int
    xid: int


@dataclass(frozen=True)
class Commit:
    """A transaction ends: ``end_lsn`` is the LSN just past its commit record."""

    commit_lsn: int
    end_lsn: int


@dataclass(frozen=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``), with its prefix and content;
    transactional ones arrive inside their transaction."""

    transactional: bool
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True)
class Relation:
    """A table as the stream describes it."""

    table: str
    columns: tuple


class PgOutputError(ValueError):
    """A message this decoder cannot read (a protocol it does not speak, or a relation it was never told)."""


def _json(text: str) -> Any:
    return json.loads(text)


def _bool(text: str) -> bool:
    return text == "t"


#: type OID -> text to value; a type not here keeps its text
_CONVERT: dict = {
    16: _bool,                       # bool
    20: int, 21: int, 23: int, 26: int,  # int8, int2, int4, oid
    700: float, 701: float,          # float4, float8
    1700: Decimal,                   # numeric
    114: _json, 3802: _json,         # json, jsonb
}

Decoded = Union[Begin, Commit, Message, RowChange, None]


class PgOutputDecoder:
    """Decodes one replication stream's messages; remembers its relations."""

    def __init__(self) -> None:
        self.relations: dict = {}
        self._handlers: dict = {
            ord("B"): self._begin, ord("C"): self._commit, ord("R"): self._relation, ord("I"): self._insert,
            ord("U"): self._update, ord("D"): self._delete, ord("T"): self._truncate,
            ord("M"): self._message, ord("Y"): _ignore, ord("O"): _ignore,
        }

    def decode(self, data: bytes) -> Decoded:
        """One message's payload (an XLogData's data) -> what it means; None for none."""
        handler = self._handlers.get(data[0]) if data else None
        if handler is None:
            raise PgOutputError(f"pgoutput message of unknown type {data[:1]!r} (is the slot's plugin pgoutput, protocol 1?)")
        try:
            return handler(memoryview(data))
        except PgOutputError:
            raise
        except (struct.error, IndexError, ValueError, ArithmeticError) as exc:  # incl. a value its type cannot parse
            raise PgOutputError(f"a truncated or malformed pgoutput {chr(data[0])!r} message: {exc}") from exc

    def _begin(self, m: memoryview) -> Begin:
        final_lsn, ts_us, xid = struct.unpack_from(">QqI", m, 1)
        return Begin(final_lsn, (ts_us + PG_EPOCH_US) // 1000, xid)

    def _commit(self, m: memoryview) -> Commit:
        _flags, commit_lsn, end_lsn, _ts = struct.unpack_from(">BQQq", m, 1)
        return Commit(commit_lsn, end_lsn)

    def _message(self, m: memoryview) -> Message:
        flags = m[1]
        prefix, pos = _string(m, 10)  # after the flags and the message's LSN
        (size,) = struct.unpack_from(">I", m, pos)
        content = bytes(m[pos + 4:pos + 4 + size])
        if len(content) != size:
            raise PgOutputError(f"a logical message cut short: {len(content)} of {size} bytes")
        return Message(bool(flags & 1), prefix, content)

    def _relation(self, m: memoryview) -> None:
        (relid,) = struct.unpack_from(">I", m, 1)
        namespace, pos = _string(m, 5)
        name, pos = _string(m, pos)
        (ncols,) = struct.unpack_from(">H", m, pos + 1)  # after the replica identity byte
        pos += 3
        columns = []
        for _ in range(ncols):
            flags = m[pos]
            column, pos = _string(m, pos + 1)
            type_oid, _typmod = struct.unpack_from(">Ii", m, pos)
            pos += 8
            columns.append(Column(column, type_oid, bool(flags & 1)))
        self.relations[relid] = Relation(f"{namespace}.{name}" if namespace else name, tuple(columns))
        return None

    def _relation_of(self, m: memoryview) -> Relation:
        (relid,) = struct.unpack_from(">I", m, 1)
        relation = self.relations.get(relid)
        if relation is None:
            raise PgOutputError(f"a change to relation {relid}, which no Relation message described")
        return relation

    def _insert(self, m: memoryview) -> Insert:
        relation = self._relation_of(m)
        row, _, _ = _tuple(m, 6, relation)  # after relid and 'N'
        return Insert(relation.table, row)

    def _update(self, m: memoryview) -> Update:
        relation = self._relation_of(m)
        old, pos = None, 5
        if m[pos] in (ord("K"), ord("O")):
            old, _, pos = _tuple(m, pos + 1, relation, keys_only=m[pos] == ord("K"))
        row, unchanged, _ = _tuple(m, pos + 1, relation)
        return Update(relation.table, row, old, unchanged)

    def _delete(self, m: memoryview) -> Delete:
        relation = self._relation_of(m)
        row, _, _ = _tuple(m, 6, relation, keys_only=m[5] == ord("K"))
        return Delete(relation.table, row)

    def _truncate(self, m: memoryview) -> Optional[Truncate]:
        (count,) = struct.unpack_from(">I", m, 1)
        relids = struct.unpack_from(f">{count}I", m, 6)
        tables = [self.relations[r].table for r in relids if r in self.relations]
        if len(tables) != 1:
            # One TRUNCATE of several published tables: one element per table would need
            # t for each; a single table is what a flow meets in practice.
            raise PgOutputError(f"a TRUNCATE of {count} tables at once: truncate published tables one per statement")
        return Truncate(tables[0])


def _ignore(m: memoryview) -> None:
    return None


def _string(m: memoryview, pos: int) -> tuple:
    end = bytes(m[pos:]).index(0) + pos
    return str(m[pos:end], "utf-8"), end + 1


def _tuple(m: memoryview, pos: int, relation: Relation, keys_only: bool = False) -> tuple:
    """TupleData at ``pos`` -> (row dict, columns unchanged, position after it). ``keys_only``:
    an old key, where the columns not in the key are sent as nulls and are left out."""
    (ncols,) = struct.unpack_from(">H", m, pos)
    pos += 2
    row: dict = {}
    unchanged = []
    columns = relation.columns
    if ncols != len(columns):
        raise PgOutputError(f"a row of {ncols} columns for {relation.table!r}, described with {len(columns)}")
    for column in columns:
        kind = m[pos]
        pos += 1
        if kind == 0x74:  # 't': text
            (size,) = struct.unpack_from(">i", m, pos)
            text = str(m[pos + 4:pos + 4 + size], "utf-8")
            pos += 4 + size
            convert: Optional[Callable] = _CONVERT.get(column.type_oid)
            value = text if convert is None else convert(text)
        elif kind == 0x6E:  # 'n': null
            value = None
        elif kind == 0x75:  # 'u': an unchanged TOASTed value, not sent
            unchanged.append(column.name)
            continue
        else:
            raise PgOutputError(f"a column value of kind {chr(kind)!r} in {relation.table!r} (binary values are not asked for)")
        if keys_only and not column.key:
            continue
        row[column.name] = value
    return row, tuple(unchanged), pos
