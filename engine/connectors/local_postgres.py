"""A local PostgreSQL server for tests and the demos: ``initdb`` and ``pg_ctl`` from the
system's PostgreSQL (Debian: ``apt-get install postgresql``), in a private temporary
directory, on a free loopback port, with ``trust`` authentication for local connections.

:class:`~driftstream.engine.connectors.postgres_sink.PostgresSink` works against any
PostgreSQL given its DSN; this is only the embedded default.

>>> with local_postgres() as pg:                # doctest: +SKIP
...     print(pg.dsn)
host=127.0.0.1 port=40211 dbname=postgres user=postgres

PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user
(its data directory is handed to it).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from driftstream.engine.connectors.local_kafka import free_port


def pg_bin(program: str) -> str:
    """The path of a PostgreSQL server program (``initdb``, ``pg_ctl``): on PATH, else the
    newest ``/usr/lib/postgresql/<version>/bin``; RuntimeError saying what to install."""
    found = shutil.which(program)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{program}"), key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if versions:
        return versions[-1]
    raise RuntimeError(f"no PostgreSQL server program {program!r}: install PostgreSQL (Debian: apt-get install postgresql)")


@dataclass
class LocalPostgres:
    """A running local server: where clients find it, and its data directory."""

    port: int
    root: Path
    user: str

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user={self.user}"

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        _run([pg_bin("pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w", "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _as_server_user() -> Optional[str]:
    """The user the server must run as: ``postgres`` when this process is root, else None (itself)."""
    return "postgres" if os.geteuid() == 0 else None


def _run(cmd: list, check: bool = True) -> subprocess.CompletedProcess:
    user = _as_server_user()
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def start_local_postgres(timeout_s: float = 60.0) -> LocalPostgres:
    """Create a cluster in a new private directory and start it; returns when it accepts connections."""
    root = Path(tempfile.mkdtemp(prefix="driftstream-pg-"))
    server_user = _as_server_user()
    if server_user is not None:
        entry = pwd.getpwnam(server_user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    os.chmod(root, 0o700)
    user = server_user or pwd.getpwuid(os.geteuid()).pw_name
    port = free_port()
    data = root / "data"
    try:
        _run([pg_bin("initdb"), "-D", str(data), "-U", user, "--auth=trust", "--no-sync", "-E", "UTF8"])
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"
        _run([pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "server.log"), "-w", "-t", str(int(timeout_s)), "start"])
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    pg = LocalPostgres(port, root, user)
    deadline = time.time() + timeout_s
    while not _accepts(pg):
        if time.time() > deadline:
            log = (root / "server.log").read_text(errors="replace")[-2000:] if (root / "server.log").exists() else ""
            pg.stop()
            raise RuntimeError(f"the local PostgreSQL did not accept connections within {timeout_s:g} s: {log}")
        time.sleep(0.1)
    return pg


def _accepts(pg: LocalPostgres) -> bool:
    import psycopg

    try:
        psycopg.connect(pg.dsn, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


@contextmanager
def local_postgres() -> Iterator[LocalPostgres]:
    """A local server for the length of a ``with`` block."""
    pg = start_local_postgres()
    try:
        yield pg
    finally:
        pg.stop()
