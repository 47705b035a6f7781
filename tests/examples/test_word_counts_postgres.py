"""The PostgreSQL word-count example: the table holds every word's final count."""

from __future__ import annotations

from collections import Counter

from driftstream.engine.connectors.postgres_sink import read_table
from driftstream.examples.wordcount import corpus
from driftstream.examples.word_counts_postgres import TABLE, flow


def test_the_table_holds_each_words_count(postgres):
    flow(postgres.dsn, lines=300).run(runtime="simulator", parallelism=2, seed=1)
    expected = Counter(w for line in corpus(300) for w in line.split())
    assert {r["word"]: r["n"] for r in read_table(postgres.dsn, TABLE)} == dict(expected)
