"""The inverted index over a backlog as Spark's native streaming SQL: the throughput baseline.

Spark's strongest form that runs here. The latency baseline (:mod:`.spark_baseline`)
needs Python for the per-change records (``transformWithState``); over a backlog
Spark does best with JVM operators only, so this form keeps the same state (each
word's posting list, page id and positions) but emits less:

- input: JSON-lines files of documents ``{"page_id", "text"}`` already in a
  directory (Spark's file source; no Kafka connector jar is installable here, and
  its Python Kafka data source is slower), ``maxFilesPerTrigger`` files per
  micro-batch, ``Trigger.AvailableNow`` (the backlog, then stop);
- words and positions by SQL expressions, no UDF: ``[\\p{L}\\p{N}_]+`` matches
  (the code points of Python's ``\\w``), lower-cased, as :func:`.documents.tokenize`;
- ``groupBy(word).agg(collect_list(struct(page_id, positions)))``: the posting
  list in the RocksDB state store (changelog checkpointing), update mode;
- output per micro-batch: one row ``(word, df)`` per word the batch changed, not
  one record per change as driftstream emits (and with ``df`` after the batch, not
  after each document);
- exactly-once: the checkpoint location (offset log, commit log, versioned state)
  and a ``foreachBatch`` sink that overwrites ``batch=<id>`` (idempotent by batch).

The run's figures come from the query's progress events: each micro-batch's end
time and its input rows, so "the rate of each fifth" is by micro-batch.

    python -m driftstream.examples.inverted_index.spark_native --input DIR --out DIR --checkpoint DIR --files-per-batch 10

prints one JSON object: the seconds from the query's start to its end, the batches,
and the rows per batch. :func:`run_spark_native` writes the input files, runs it in
a subprocess (its own JVM, gone when it ends) and checks the final ``df`` per word.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from driftstream.examples.inverted_index.document_files import DOCS_PER_FILE, write_documents
from driftstream.examples.inverted_index.documents import word_positions

SCHEMA = "page_id long, text string"

#: Python's ``re`` ``\w`` in Java's dialect: letters, numbers, underscore (the same set of
#: code points; Java's ``(?U)\w`` adds combining marks and leaves out ``No`` numbers such as ``²``).
WORD_PATTERN = r"[\p{L}\p{N}_]+"


def changed_words(docs):
    """Documents ``(page_id, text)`` -> ``(word, df)`` per word: the posting list of each word
    (page id, positions) aggregated, its size as ``df``. Streaming or batch alike."""
    from pyspark.sql import functions as F

    tokens = F.transform(F.regexp_extract_all(F.col("text"), F.lit(WORD_PATTERN), 0), lambda w: F.lower(w))
    # positions of each distinct word, in the document's own row: stateless, no shuffle before the grouping
    postings = F.transform(
        F.array_distinct("tokens"),
        lambda w: F.struct(
            w.alias("word"),
            F.filter(F.sequence(F.lit(0), F.size("tokens") - 1), lambda i: F.col("tokens")[i] == w).alias("positions"),
        ),
    )
    rows = (
        docs.select("page_id", tokens.alias("tokens"))
        .select("page_id", F.explode(postings).alias("p"))
        .select("p.word", "page_id", "p.positions")
    )
    index = rows.groupBy("word").agg(F.collect_list(F.struct("page_id", "positions")).alias("postings"))
    return index.select("word", F.size("postings").alias("df"))


def build_query(spark, input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int):
    """The streaming query (started) over the files of ``input_dir``, ``files_per_batch`` per micro-batch."""
    docs = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files_per_batch).json(input_dir)

    def write(batch, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(os.path.join(output_dir, f"batch={batch_id}"))

    return (
        changed_words(docs).writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def warm_up(spark, input_dir: str) -> None:
    """The same plan once as a batch job over the first input file, before the clock starts:
    the first micro-batch would otherwise pay for code generation and the JIT
    (~20 s of a 1,000-document batch here), which no later batch pays."""
    first = sorted(Path(input_dir).glob("*.json"))[:1]
    if first:
        changed_words(spark.read.schema(SCHEMA).json(str(first[0]))).collect()


def _progress_rows(progress: Sequence[dict]) -> list:
    """``(end_epoch_s, input rows)`` per micro-batch, from Spark's progress events."""
    from datetime import datetime

    out = []
    for p in progress:
        start = datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        end = start + p.get("batchDuration", 0) / 1000.0
        out.append((end, int(p.get("numInputRows", 0))))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.spark_native", description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--files-per-batch", type=int, default=10)
    ap.add_argument("--shuffle-partitions", type=int, default=2)
    args = ap.parse_args(argv)
    from .spark_baseline import spark_session

    spark = spark_session(args.shuffle_partitions, "rocksdb", conf=[("spark.sql.streaming.numRecentProgressUpdates", "100000")])
    try:
        warm_up(spark, args.input)
        started = time.time()
        query = build_query(spark, args.input, args.out, args.checkpoint, args.files_per_batch)
        query.awaitTermination()
        ended = time.time()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = [json.loads(p.json) for p in query.recentProgress]
        batches = [b for b in _progress_rows(progress) if b[1] > 0]
        print(json.dumps({"started": started, "ended": ended, "batches": batches}), flush=True)
        return 0
    finally:
        spark.stop()


def final_df(output_dir: Path) -> dict:
    """``{word: df}`` after the last micro-batch, read from the sink's batch directories."""
    import pyarrow.parquet as pq

    batches = sorted((int(p.name.split("=", 1)[1]), p) for p in output_dir.glob("batch=*"))
    df: dict = {}
    for _, path in batches:
        table = pq.read_table(path)
        df.update(zip(table.column("word").to_pylist(), table.column("df").to_pylist()))
    return df


def rows_written(output_dir: Path) -> int:
    """The rows the query wrote over all its micro-batches (one per word a batch changed,
    with its df at the batch's end), read from the Parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in output_dir.glob("batch=*/*.parquet"))


def check_final_df(got: dict, docs: Sequence[dict]) -> list:
    """Differences between Spark's final ``df`` per word and the index of ``docs`` (one page each).

    >>> check_final_df({"a": 2, "b": 1}, [{"page_id": 1, "text": "a b"}, {"page_id": 2, "text": "A"}])
    []
    >>> check_final_df({"a": 1}, [{"page_id": 1, "text": "a b"}, {"page_id": 2, "text": "a"}])
    ['2 word(s) differ, e.g. a: 1 instead of 2; b: missing instead of 1']
    """
    want = Counter(w for d in docs for w in word_positions(d["text"]))
    bad = sorted(w for w in set(want) | set(got) if got.get(w) != want.get(w))
    if not bad:
        return []
    examples = "; ".join(f"{w}: {got.get(w, 'missing')} instead of {want.get(w, 'absent')}" for w in bad[:5])
    return [f"{len(bad)} word(s) differ, e.g. {examples}"]


def run_spark_native(docs: Sequence[dict], workdir: Optional[Path] = None, docs_per_batch: int = 1000) -> dict:
    """Run the native query over ``docs`` (written as files first) in a subprocess; returns its figures.

    The clock starts with the query, after the JVM, the session and a warm-up batch job
    (:func:`warm_up`); ``seconds_total`` is the whole process."""
    work = Path(workdir or tempfile.mkdtemp(prefix="driftstream-spark-native-"))
    files = write_documents(docs, work / "input")
    per_batch = max(1, docs_per_batch // DOCS_PER_FILE)
    cmd = [sys.executable, "-m", __name__, "--input", str(work / "input"), "--out", str(work / "out"),
           "--checkpoint", str(work / "checkpoint"), "--files-per-batch", str(per_batch)]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"spark native query failed ({proc.returncode}): {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    got = final_df(work / "out")
    return {
        "engine": "spark-native",
        "docs": len(docs),
        "files": files,
        "docs_per_batch": per_batch * DOCS_PER_FILE,
        "seconds_total": round(time.time() - launched, 2),
        "started": report["started"],
        "completions": [(end, rows) for end, rows in report["batches"]],
        "rows_out": rows_written(work / "out"),  # what it wrote, as the others' records are counted
        "words": len(got),
        "problems": check_final_df(got, docs),
    }


if __name__ == "__main__":
    sys.exit(main())
