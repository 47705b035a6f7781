"""What a change to a database table is, as a flow's element: :class:`Insert`, :class:`Update`,
:class:`Delete` and :class:`Truncate`, all :class:`RowChange` (what
:class:`~driftstream.engine.connectors.postgres_source.PostgresSource` emits).

A :class:`~driftstream.engine.connectors.postgres_sink.PostgresSink` with ``mode="upsert"``
applies them as they are (an insert or update is an upsert of ``row``, a delete removes its
key's row, a truncate empties the table), so a flow can keep a table equal to another:

>>> flow.source(PostgresSource(dsn, "pub", "slot")).sink(                      # doctest: +SKIP
...     PostgresSink(dsn, "replica", mode="upsert", key=["id"]))

A filter or a map sees the change with its type:

>>> change = Update("public.users", {"id": 1, "name": "b"}, old=None)
>>> isinstance(change, RowChange), change.row["name"], change.table
(True, 'b', 'public.users')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class RowChange:
    """A change to ``table`` (``schema.name``)."""

    table: str


@dataclass(frozen=True)
class Insert(RowChange):
    """A new row: every column (column name -> value)."""

    row: dict


@dataclass(frozen=True)
class Update(RowChange):
    """A row's new values. ``row`` lacks columns whose large (TOASTed) value did not change,
    named in ``unchanged``; ``old``: the old key (or the whole old row under ``REPLICA IDENTITY
    FULL``) when the server sends it (the key changed, or identity full), else None."""

    row: dict
    old: Optional[dict] = None
    unchanged: tuple = field(default=())


@dataclass(frozen=True)
class Delete(RowChange):
    """A row removed: ``row`` holds its key columns (every column under ``REPLICA IDENTITY FULL``)."""

    row: dict


@dataclass(frozen=True)
class Truncate(RowChange):
    """Every row of ``table`` removed."""
