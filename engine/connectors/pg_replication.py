"""ReplicationStream: one logical replication slot's stream, read without blocking.

PostgreSQL's streaming replication protocol over libpq (psycopg's ``pq`` layer, the libpq
the PostgreSQL sink already uses): a connection with ``replication=database`` runs
``START_REPLICATION SLOT ... LOGICAL``, then the server sends ``XLogData`` messages (a
plugin's output, here pgoutput) and keepalives, and the client sends status updates whose
*flush* position is what the slot may forget: the server keeps the WAL from there on, and a
new stream starts there. :meth:`confirm` is the only way that position moves, so nothing is
confirmed that a committed snapshot does not hold.

>>> stream = ReplicationStream(dsn, "slot", {"proto_version": "1", "publication_names": "pub"})  # doctest: +SKIP
>>> stream.messages()          # [(data_start LSN, payload bytes), ...]; [] when none is ready  # doctest: +SKIP
>>> stream.confirm(lsn)        # the slot may forget what comes before lsn                      # doctest: +SKIP

Costs: :meth:`messages` is one non-blocking read of the socket plus O(bytes) to split it.
"""

from __future__ import annotations

import struct
import time
from typing import Any, Optional

#: Seconds between status updates when the server asks for none (its ``wal_sender_timeout``
#: is 60 s by default: a client silent for that long is dropped).
STATUS_INTERVAL_S = 10.0


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it.

    >>> lsn_text(22185056)
    '0/1528460'
    """
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_of(text: str) -> int:
    """PostgreSQL's text form of an LSN as an int.

    >>> lsn_of('0/1528460')
    22185056
    """
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _pg_now_us() -> int:
    """Now, in microseconds since 2000-01-01 (the protocol's clock)."""
    return int(time.time() * 1_000_000) - 946_684_800_000_000


#: SQLSTATE object_in_use: the slot is active for another connection's walsender.
SLOT_IN_USE = "55006"


class ReplicationError(ConnectionError):
    """The stream could not start or broke: the server's message."""


class ReplicationStream:
    """A started stream of ``slot`` (``options``: the plugin's, e.g. pgoutput's publication).

    ``wal_end``: the highest WAL position the server reported: a keepalive's is how far it
    has read the WAL for the slot, a commit's XLogData the end of that commit. A logical
    walsender sends each transaction whole at its commit, in commit order, so every
    transaction that committed before ``wal_end`` was sent before the message that told it.
    """

    def __init__(self, dsn: str, slot: str, options: dict, timeout_s: float = 30.0) -> None:
        from psycopg import pq

        self._pq = pq
        self.slot = slot
        self.confirmed = 0
        self.wal_end = 0
        self._last_status = 0.0
        deadline = time.monotonic() + timeout_s
        while True:
            refused = self._start(dsn, slot, options, deadline, timeout_s)
            if refused is None:
                return
            state, message = refused
            # The slot is still held by the walsender of a connection that just ended (a reader
            # closed or a process killed a moment before): the server frees it once it sees the
            # end. Seen under load: a replay opened right after its reader's close was refused.
            if state != SLOT_IN_USE or time.monotonic() > deadline:
                raise ReplicationError(f"START_REPLICATION of slot {slot!r} refused: {message}")
            time.sleep(0.1)

    def _start(self, dsn: str, slot: str, options: dict, deadline: float, timeout_s: float) -> Optional[tuple]:
        """Open the connection and start the stream: None, or ``(SQLSTATE, message)`` of a refusal
        (the connection then closed)."""
        from psycopg.conninfo import make_conninfo

        pq = self._pq
        # either form of DSN (key=value or postgresql:// URI), with the replication parameter added
        conn = pq.PGconn.connect(make_conninfo(dsn, replication="database").encode())
        if conn.status != pq.ConnStatus.OK:
            message = conn.get_error_message().strip()
            conn.finish()
            raise ReplicationError(f"cannot open a replication connection: {message}")
        self.conn: Any = conn
        opts = ", ".join(f"{_ident(k)} '{str(v).replace(chr(39), chr(39) * 2)}'" for k, v in options.items())
        conn.send_query(f"START_REPLICATION SLOT {_ident(slot)} LOGICAL 0/0 ({opts})".encode())
        while True:
            conn.consume_input()
            if not conn.is_busy():
                break
            if time.monotonic() > deadline:
                self.close()
                raise ReplicationError(f"START_REPLICATION of slot {slot!r}: no answer within {timeout_s:g} s")
            time.sleep(0.01)
        result = conn.get_result()
        if result is not None and result.status == pq.ExecStatus.COPY_BOTH:
            return None
        field = (lambda code: (result.error_field(code) or b"").decode(errors="replace")) if result else (lambda code: "")
        refusal = (field(pq.DiagnosticField.SQLSTATE), field(pq.DiagnosticField.MESSAGE_PRIMARY) or conn.get_error_message().strip())
        self.close()
        return refusal

    def messages(self) -> list:
        """The XLogData messages the server has sent, as ``(data_start, payload)``; answers the
        keepalives that ask for a reply. Raises ReplicationError if the stream is broken."""
        conn = self.conn
        conn.consume_input()  # raises OperationalError if the connection is gone
        out = []
        while True:
            size, data = conn.get_copy_data(1)
            if size == 0:
                break
            if size < 0:
                raise ReplicationError(f"the replication stream of slot {self.slot!r} ended: {conn.get_error_message().strip() or 'by the server'}")
            kind = data[0]
            if kind == 0x77:  # 'w': XLogData
                start, end = struct.unpack_from(">QQ", data, 1)
                self.wal_end = max(self.wal_end, end)
                out.append((start, bytes(data[25:])))
            elif kind == 0x6B:  # 'k': keepalive
                end, _clock, reply = struct.unpack_from(">QqB", data, 1)
                self.wal_end = max(self.wal_end, end)
                if reply:
                    self._status()
        if time.monotonic() - self._last_status > STATUS_INTERVAL_S:
            self._status()
        return out

    def confirm(self, lsn: int) -> None:
        """The slot may forget everything before ``lsn`` (told to the server at once)."""
        if lsn > self.confirmed:
            self.confirmed = lsn
            self._status()

    def _status(self) -> None:
        lsn = self.confirmed
        self.conn.put_copy_data(b"r" + struct.pack(">QQQqB", lsn, lsn, lsn, _pg_now_us(), 0))
        self.conn.flush()
        self._last_status = time.monotonic()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.finish()
            self.conn = None


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
