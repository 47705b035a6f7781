"""Word counts kept in a PostgreSQL table, exactly once: ``word_counts(word, n)`` holds each
word's latest count (``PostgresSink`` in upsert mode), and each commit carries the sink
partition's ``t_last``, so a recovery neither loses nor repeats a count.

Run it on a server of yours, or without ``DRIFTSTREAM_POSTGRES_DSN`` on a local one
(``initdb`` and ``pg_ctl`` in a temporary directory, stopped when the process exits)::

    DRIFTSTREAM_POSTGRES_DSN="host=db dbname=app user=app" driftstream run driftstream.examples.word_counts_postgres:flow
    python -m driftstream.examples.word_counts_postgres      # runs, then prints the top words
"""

from __future__ import annotations

import atexit
import os
from typing import Optional

from driftstream.engine import Flow, PostgresSink
from driftstream.engine.testing import MemorySource
from driftstream.examples.wordcount import corpus, count

DSN_ENV = "DRIFTSTREAM_POSTGRES_DSN"
TABLE = "word_counts"

_local = None


def dsn() -> str:
    """``$DRIFTSTREAM_POSTGRES_DSN``, else a local server's (started once, stopped at exit)."""
    global _local
    if os.environ.get(DSN_ENV):
        return os.environ[DSN_ENV]
    if _local is None:
        from driftstream.engine.connectors.local_postgres import start_local_postgres
        from driftstream.examples.prerequisites import postgres_programs, python_module, require

        require(f"a local PostgreSQL (or ${DSN_ENV} set to your server's DSN)", [postgres_programs(), python_module("psycopg", "postgres")])

        _local = start_local_postgres()
        atexit.register(_local.stop)
        print(f"a local PostgreSQL for this run: {_local.dsn}")
    return _local.dsn


def flow(server: Optional[str] = None, lines: int = 5_000) -> Flow:
    """The word count into ``word_counts`` (created if missing) at ``server`` (default: :func:`dsn`)."""
    import psycopg

    server = server or dsn()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (word text PRIMARY KEY, n int NOT NULL)")
    f = Flow("word_counts_postgres")
    (f.source(MemorySource(corpus(lines), partitions=2), name="lines")
      .flat_map(str.split, name="split")
      .key_by(lambda w: w, name="by_word")
      .stateful_map(_counted, name="count")
      .sink(PostgresSink(server, TABLE, mode="upsert", key=["word"])))
    return f


def _counted(n: Optional[int], word: str) -> tuple:
    n, (_, total) = count(n, word)
    return n, {"word": word, "n": total}


def main() -> None:
    from driftstream.engine.connectors.postgres_sink import read_table

    server = dsn()
    result = flow(server).run(parallelism=2)
    print(result.metrics.summary())
    top = sorted(read_table(server, TABLE), key=lambda r: -r["n"])[:10]
    print("top words:", ", ".join(f"{r['word']} {r['n']}" for r in top))


if __name__ == "__main__":
    main()
