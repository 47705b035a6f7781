"""PostgresSource: a PostgreSQL database's changes as a stream, through logical replication.

Inserts, updates, deletes and truncates of the tables in ``publication`` arrive through
replication slot ``slot`` (plugin ``pgoutput``) as :class:`~.row_changes.Insert`,
:class:`~.row_changes.Update`, :class:`~.row_changes.Delete` and
:class:`~.row_changes.Truncate` elements, transaction by transaction in commit order.

An element's time comes from the WAL alone, so a replay gives the same times:
``(ts, source, 0, offset)`` where ``ts`` is the running maximum of commit times (epoch ms)
and ``offset`` is ``(commit LSN << 32) + the change's index in its transaction``.

**Position and the slot.** A snapshot saves the offset of the next change to read. After a
committed snapshot the driver records its position in table ``driftstream_source_progress``
(one row per slot) and the reader confirms that LSN to the server, so the slot keeps the WAL
of at most about one snapshot interval. Once every change the server sent is out, the position
moves on to the WAL end the server last reported (how far it has read the WAL for the slot):
the next change commits past it. So the slot of a source whose tables are idle still follows
the snapshots, and does not keep all the WAL that other tables of a busy database write. A
recovery starts the stream at the slot's position (at or before the snapshot's) and skips
what the snapshot already holds. Without snapshots
nothing is confirmed, and each run reads again from where the slot stands.

**Idle tables.** The watermark is the least time over all sources: a source whose tables
stop changing would hold back every other source's output, and every event-time window.
After ``tick_interval`` seconds without a change the reader writes a tick, an empty
transactional logical message (``pg_logical_emit_message``, PostgreSQL 14 and later),
into the WAL: its commit moves the source's time as a change would, and a replay reads
the same tick. A role that may not call the function gets a warning and no ticks.

One partition (a slot is one ordered stream). The slot and the publication are created when
missing (``tables=`` names the publication's tables; ``create_slot=False`` refuses a missing
slot); the server needs ``wal_level = logical``. A new slot sees the changes committed after
its creation, not the rows already there (copy those first). Rows of a table whose
replication identity is the default carry their key in a delete (``REPLICA IDENTITY FULL``:
the whole old row).

>>> src = PostgresSource("host=db dbname=app user=repl", "orders_pub", "driftstream_orders",
...                      tables=["public.orders"])                           # doctest: +SKIP
>>> flow.source(src).sink(PostgresSink(dsn, "orders_copy", mode="upsert", key=["id"]))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from typing import Any, Optional, Sequence

from driftstream.engine.connectors.newest_commit import NewestCommitter
from driftstream.engine.connectors.pg_replication import ReplicationError, ReplicationStream, lsn_of, lsn_text
from driftstream.engine.connectors.pgoutput import Begin, Commit, Message, PgOutputDecoder
from driftstream.engine.connectors.postgres_sink import _mask, _quote, create_if_missing
from driftstream.engine.model.connectors import Source, SourcePartition
from driftstream.engine.model.errors import FlowError

log = logging.getLogger(__name__)

#: Where each committed snapshot's position of a slot is recorded (in the slot's database).
PROGRESS_TABLE = "driftstream_source_progress"

#: offset = (commit LSN << INDEX_BITS) + the change's index in its transaction
INDEX_BITS = 32

#: Seconds between two reads of the progress table by a reader.
CONFIRM_EVERY_S = 1.0

#: The prefix of the logical messages an idle reader writes to move its time (see ``tick_interval``).
TICK_PREFIX = "driftstream-tick"

_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


def commit_lsn_of(offset: int) -> int:
    """The commit LSN of the transaction an offset falls in.

    >>> commit_lsn_of((22185056 << 32) + 3)
    22185056
    """
    return offset >> INDEX_BITS


class PostgresSource(Source):
    """The changes of ``publication``'s tables, read through replication slot ``slot``.

    ``tables``: the publication's tables, to create it when missing (``FOR TABLE ...``).
    ``create_slot``: create the slot (plugin pgoutput) when missing. ``retry_s``: how long a
    lost connection is retried (reconnecting from the reader's own position) before the run
    fails with the server's error. ``tick_interval``: seconds without a change after which
    the reader writes a tick into the WAL to move its time (None: never).
    """

    bounded = False
    epoch_ms_times = True

    def __init__(self, dsn: str, publication: str, slot: str, tables: Optional[Sequence[str]] = None,
                 create_slot: bool = True, retry_s: float = 60.0, tick_interval: Optional[float] = 1.0) -> None:
        if not _NAME.match(slot):
            raise FlowError(f"PostgresSource slot {slot!r}: a slot name is 1-63 lower-case letters, digits and underscores")
        self.dsn, self.publication, self.slot = dsn, publication, slot
        self.tables = list(tables) if tables is not None else None
        self.create_slot, self.retry_s = create_slot, retry_s
        if tick_interval is not None and not tick_interval > 0:
            raise FlowError(f"PostgresSource({slot!r}) tick_interval must be a positive number of seconds or None, not {tick_interval!r}")
        self.tick_interval = tick_interval
        self._checked = False

    def partitions(self) -> int:
        if not self._checked:
            self._prepare()
            self._checked = True
        return 1

    def _prepare(self) -> None:
        """On the driver, before the run: the server, its wal_level, the publication, the slot."""
        with self.connect() as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
            if level != "logical":
                raise FlowError(f"PostgresSource({self.slot!r}): the server's wal_level is {level!r}; logical replication needs "
                                "wal_level = logical (ALTER SYSTEM SET wal_level = logical, then restart the server)")
            if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)).fetchone() is None:
                if not self.tables:
                    raise FlowError(f"PostgresSource: no publication {self.publication!r}: create it "
                                    f"(CREATE PUBLICATION {self.publication} FOR TABLE ...) or pass tables=[...]")
                conn.execute(f"CREATE PUBLICATION {_quote(self.publication)} FOR TABLE {', '.join(map(_quote, self.tables))}")
            slot = conn.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
            if slot is None:
                if not self.create_slot:
                    raise FlowError(f"PostgresSource: no replication slot {self.slot!r} (create_slot=False): "
                                    f"SELECT pg_create_logical_replication_slot('{self.slot}', 'pgoutput')")
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
            elif slot[0] != "pgoutput":
                raise FlowError(f"PostgresSource: slot {self.slot!r} uses plugin {slot[0]!r}; it needs pgoutput")
            _ensure_progress_table(conn)

    def connect(self) -> Any:
        """A plain (autocommit) connection to the slot's database."""
        import psycopg

        try:
            return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10, application_name=f"driftstream-{self.slot}"[:63])
        except psycopg.OperationalError as exc:
            raise ConnectionError(f"PostgresSource({self.slot!r}): cannot connect to PostgreSQL at {_mask(self.dsn)}: {str(exc).strip()}") from exc

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> SourcePartition:
        return PostgresChangeReader(self, source_id, start)

    def commit_hook(self) -> "SlotProgress":
        return SlotProgress(self)

    def __repr__(self) -> str:
        return f"PostgresSource({_mask(self.dsn)!r}, {self.publication!r}, {self.slot!r})"


def _ensure_progress_table(conn: Any) -> None:
    create_if_missing(conn, f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (slot text PRIMARY KEY, lsn pg_lsn NOT NULL, "
                            "updated_at timestamptz NOT NULL DEFAULT now())")


class SlotProgress(NewestCommitter):
    """On the driver: each committed snapshot's position of the slot, into the progress table."""

    def __init__(self, source: PostgresSource) -> None:
        super().__init__(f"postgres-slot-{source.slot}")
        self.source = source
        self._conn: Any = None

    def describe(self) -> dict:
        return {"slot": self.source.slot}

    def _commit(self, offsets: dict) -> None:
        lsn = commit_lsn_of(offsets[0])
        if lsn == 0:
            return
        if self._conn is None:
            self._conn = self.source.connect()
        self._conn.execute(f"INSERT INTO {PROGRESS_TABLE} (slot, lsn) VALUES (%s, %s) ON CONFLICT (slot) "
                           "DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = now()", (self.source.slot, lsn_text(lsn)))

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class PostgresChangeReader(SourcePartition):
    """The slot's stream: decodes changes, stamps times, confirms committed positions."""

    def __init__(self, source: PostgresSource, source_id: int, start: Optional[tuple] = None) -> None:
        self.source, self.source_id = source, source_id
        self.next_offset, self.ts = (0, float("-inf")) if start is None else (start[0], start[1])
        self._skip_before = self.next_offset  # a replay re-reads from the slot's position: skip what came before
        self._ready: deque = deque()
        self._decoder = PgOutputDecoder()
        self._tx: Optional[Begin] = None
        self._index = 0
        self._tx_ts = self.ts
        self._stream: Optional[ReplicationStream] = None
        self._progress: Any = None
        self._opened_at: Any = None
        self._next_confirm = 0.0
        self._last_commit: Optional[int] = None  # the commit LSN of the last transaction read whole
        self._messages = False  # the server sends logical messages (ticks): PostgreSQL 14 and later
        self._idle_since = time.monotonic()
        self.reconnects = 0
        self.ticks_sent = 0
        self._connect()

    def _connect(self) -> None:
        """Open the stream (retrying for ``retry_s``), after checking that the slot has not moved past the reader's position."""
        deadline = time.monotonic() + self.source.retry_s
        pause = 0.1
        while True:
            try:
                self._check_slot()
                options = {"proto_version": "1", "publication_names": self.source.publication}
                if self._messages:
                    options["messages"] = "true"
                self._stream = ReplicationStream(self.source.dsn, self.source.slot, options)
                self._decoder = PgOutputDecoder()  # a new stream describes its relations again
                self._tx = None
                return
            except (ReplicationError, ConnectionError) as exc:
                if time.monotonic() + pause > deadline:
                    raise ConnectionError(f"PostgresSource({self.source.slot!r}): the replication stream failed for "
                                          f"{self.source.retry_s:g} s (retry_s): {exc}") from exc
                log.warning("PostgresSource %s: %s; retrying in %.1f s", self.source.slot, exc, pause)
                time.sleep(pause)
                pause = min(2.0, pause * 2)

    def _check_slot(self) -> None:
        import psycopg

        try:
            if self._progress is None or self._progress.closed:
                self._progress = self.source.connect()
                self._opened_at, version = self._progress.execute("SELECT now(), current_setting('server_version_num')::int").fetchone()
                self._messages = self.source.tick_interval is not None and version >= 140000
            row = self._progress.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                         (self.source.slot,)).fetchone()
        except psycopg.OperationalError as exc:
            self._progress = None
            raise ConnectionError(str(exc).strip()) from exc
        if row is None:
            raise FlowError(f"PostgresSource: replication slot {self.source.slot!r} is gone: the changes since the flow's "
                            "snapshot cannot be read again; start the flow anew (it creates the slot)")
        confirmed = lsn_of(row[0]) if row[0] else 0
        wanted = commit_lsn_of(self._skip_before)
        if wanted and confirmed > wanted:
            raise FlowError(f"PostgresSource: slot {self.source.slot!r} is at {lsn_text(confirmed)}, past the position the flow "
                            f"resumes from ({lsn_text(wanted)}): the changes between are gone. Was the slot used by another "
                            "reader, or an older snapshot restored? Start the flow anew, or from its newest snapshot")

    def read(self, max_items: int) -> list:
        if not self._ready:
            self._pull()
        out = []
        while self._ready and len(out) < max_items:
            out.append(self._ready.popleft())
        if out:
            self.next_offset = out[-1][0][3] + 1
        if not self._ready and self._tx is None and self._stream is not None:
            # All the server sent is out, and it sends transactions whole in commit order: the
            # next change commits at or past the WAL end it last reported (a keepalive's: how far
            # it has decoded; a commit's end). Moving the position there lets the snapshots of
            # a source whose tables are idle move the slot past the WAL of other tables.
            self.next_offset = max(self.next_offset, self._stream.wal_end << INDEX_BITS)
        return out

    def _pull(self) -> None:
        import psycopg

        try:
            messages = self._stream.messages()
            if time.monotonic() >= self._next_confirm:
                self._confirm_committed()
        except (ReplicationError, psycopg.OperationalError) as exc:
            log.warning("PostgresSource %s: the stream broke (%s); reconnecting from offset %d", self.source.slot, exc, self.next_offset)
            self._stream.close()
            self._skip_before = max(self._skip_before, self.next_offset)  # nothing is ready here: read() pulls only when empty
            self.reconnects += 1
            self._connect()
            return
        if not messages:
            self._maybe_tick()
            return
        self._idle_since = time.monotonic()
        sid = self.source_id
        for _, payload in messages:
            msg = self._decoder.decode(payload)
            if msg is None or isinstance(msg, Message):  # a tick counts by its transaction's commit
                continue
            if isinstance(msg, Begin):
                # the running max of commit times (a replay restores it with the position)
                self._tx, self._index, self._tx_ts = msg, 0, max(self.ts, msg.commit_ms)
            elif isinstance(msg, Commit):
                # A transaction read whole moves the time, changes or not (a tick): what is
                # skipped on a replay was at or below the saved running time anyway.
                self._tx, self._last_commit, self.ts = None, msg.commit_lsn, self._tx_ts
            else:
                offset = (self._tx.final_lsn << INDEX_BITS) + self._index
                self._index += 1
                if offset >= self._skip_before:
                    self.ts = self._tx_ts
                    self._ready.append(((self.ts, sid, 0, offset, (), False), msg))

    def _maybe_tick(self) -> None:
        """Write a tick into the WAL if nothing came for ``tick_interval`` (see the module docstring)."""
        import psycopg

        interval = self.source.tick_interval
        if not self._messages or interval is None or time.monotonic() - self._idle_since < interval:
            return
        self._idle_since = time.monotonic()
        try:
            self._progress.execute("SELECT pg_logical_emit_message(true, %s, '')", (TICK_PREFIX,))
            self.ticks_sent += 1
        except psycopg.errors.InsufficientPrivilege as exc:
            self._messages = False
            log.warning("PostgresSource %s: no ticks (%s): while its tables stay unchanged, its time does not move, and "
                        "the flow's watermark waits (GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) "
                        "to the role)", self.source.slot, str(exc).strip())

    def bound(self) -> Optional[tuple]:
        """Below every change still to come, once every change read is out: the next
        transaction commits past the last one read whole, at or after the running time."""
        if self._ready or self._tx is not None or self._last_commit is None:
            return None
        return (self.ts, self.source_id, 0, ((self._last_commit + 1) << INDEX_BITS) - 1)

    def _confirm_committed(self) -> None:
        """Confirm the position of the newest snapshot committed since this reader opened."""
        self._next_confirm = time.monotonic() + CONFIRM_EVERY_S
        row = self._progress.execute(f"SELECT lsn::text FROM {PROGRESS_TABLE} WHERE slot = %s AND updated_at >= %s",
                                     (self.source.slot, self._opened_at)).fetchone()
        if row is not None:
            self._stream.confirm(lsn_of(row[0]))

    def position(self) -> tuple:
        return (self.next_offset, self.ts)

    def fetch_state(self) -> Optional[dict]:
        stream = self._stream
        return None if stream is None else {"slot": self.source.slot, "confirmed_lsn": lsn_text(stream.confirmed),
                                            "wal_end": lsn_text(stream.wal_end), "reconnects": self.reconnects, "ticks_sent": self.ticks_sent}

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._progress is not None:
            self._progress.close()
