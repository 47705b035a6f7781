"""The inverted index as a Spark Structured Streaming query: the benchmark's baseline.

Same workload as the driftstream pipeline: documents ``{"page_id", "title",
"text", "sent_at_ms"}`` (JSON) come from a one-partition Kafka topic; every
document yields, for each of its distinct words, in order of first occurrence::

    {"op": "add", "word": w, "page_id": p, "positions": [...], "df": n}

where ``df`` is the number of distinct pages holding ``w`` after the change (a
page sent again replaces its positions). The records go, as compact JSON, to the
output topic.

Query
-----
``driftstream_kafka`` source (:mod:`.spark_kafka`, Kafka offsets in Spark's
checkpoint) -> a Python UDF splits each document into ``(word, page_id,
positions, offset, rank)`` rows with :func:`documents.word_positions` -> grouped
by word -> ``transformWithState`` (row API): the state of a word is its index
``{page_id: positions}`` (JSON in a ValueState, in the RocksDB state store),
the group's rows are applied sorted by input offset -> ``driftstream_kafka``
sink, which writes each micro-batch sorted by ``(offset, rank)``: document by
document and within a document in word order, the order the driftstream
engine releases. The sink is idempotent by batch id (see :mod:`.spark_kafka`)
and Spark's checkpoint (offset log, commit log, versioned state) replays an
unfinished micro-batch exactly: end-to-end exactly-once. Output mode is
Append (Python data source sinks support no other; every record is new anyway).

Configuration (chosen by measurement, local[2] on a shared 2-core machine)
--------------------------------------------------------------------------
CPU is the scarce resource, so configurations were compared by the CPU seconds
and wall time the whole process tree spends on a backlog of 100 documents of
80-200 words (Zipf over 8,000 words; ~100 distinct words, i.e. ~100 groups,
per document), three rounds each:

- ``transformWithState`` over ``applyInPandasWithState``: ~11 vs ~24 CPU-s
  per 100 documents. The pandas API builds pandas objects per group (input
  slice, state frame, output frame: ~1 ms a group); the row API pays three
  small round trips to the JVM state server per group instead. (The per-word
  keying makes groups small and many: this per-group cost dominates.)
- RocksDB state store (required by ``transformWithState``) with changelog
  checkpointing (a small changelog per batch instead of uploading SST files)
  and ``trackTotalNumberOfRows=false`` (no read before every write).
- a plain Python UDF + ``explode`` to split documents: ``mapInArrow`` measured
  the same, the UDF is simpler.
- ``spark.sql.shuffle.partitions=2``: one stateful task per core; 1 partition
  was ~40 % slower on the backlog.
- ``spark.sql.streaming.noDataMicroBatches.enabled=false`` (no timers or
  watermarks: a batch without data would only add work),
  ``spark.ui.enabled=false``, ``spark.ui.showConsoleProgress=false``,
  ``spark.locality.wait=0s``, ``spark.python.worker.reuse=true`` (forked
  workers stay warm), shuffle / spill compression off, log level ERROR.
- The sink receives Arrow batches (``DataSourceStreamArrowWriter``), not Rows.
- A warm-up batch job (the split UDF and the stateful processor on 4 tiny
  documents) before the query starts, so the first micro-batch does not pay
  for forking the Python workers. The first micro-batch still pays for the
  JIT and the state stores' creation (several seconds): skip it when measuring.

Measured (publish -> a document's last change record read back; load average
5-13 from other work on the machine, so the numbers are rough):

- 1 doc/s: p50 1.8 s (trigger 100ms), 1.5 s (1s), 4.5 s (0: an empty trigger
  every 10 ms costs a source round trip, which hurts on a loaded machine);
  at load ~12, trigger 100ms: 3.8 s, vs 4.8 s with 1 shuffle partition and
  9.0 s with ``applyInPandasWithState`` + HDFS-backed store.
  A micro-batch of one document takes ~1.0-1.3 s (walCommit ~70 ms,
  commitOffsets ~130 ms, planning ~100 ms, execution ~800 ms).
- 10 docs/s: p50 6-9 s; batches of ~50 documents, 4-5 s each.
- 50 docs/s: not sustained (~10-30 docs/s depending on batch size and load);
  the backlog grows, p50 33-45 s after a 25 s feed.

CLI::

    python -m driftstream.examples.inverted_index.spark_baseline --bootstrap HOST:PORT \\
        --input-topic T --output-topic O --checkpoint DIR --trigger 100ms [--run-seconds N]

prints ``READY`` once the query has completed its first (possibly empty)
micro-batch and runs until SIGTERM / SIGINT (or ``N`` seconds).
:func:`start_spark_baseline` runs it as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional, Sequence

from driftstream.examples.inverted_index.documents import word_positions

TRIGGERS = {"0": "0 seconds", "100ms": "100 milliseconds", "1s": "1 second"}
WORDS_SCHEMA = "word string, page_id long, positions array<int>, offset long, rank int"
SPLIT_TYPE = "array<struct<word:string,page_id:bigint,positions:array<int>,offset:bigint,rank:int>>"
OUT_SCHEMA = "offset long, rank int, key string, value string"
STATE_SCHEMA = "index string"
STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}

# The configuration the measurements chose (module docstring).
DEFAULTS = dict(api="tws", split="udf", state_store="rocksdb", shuffle_partitions=2)


def _dumps(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"))


# ------------------------------------------------------------------ the index logic


def split_document(offset: int, value: str) -> list[tuple]:
    """One input record -> ``(word, page_id, positions, offset, rank)`` per distinct word of its text."""
    doc = json.loads(value)
    page = int(doc["page_id"])
    return [(w, page, p, offset, rank) for rank, (w, p) in enumerate(word_positions(doc.get("text") or "").items())]


def _split_rows(offset, value):
    # No type hints: Spark 4 would try to infer an Arrow UDF type from them.
    return split_document(offset, value)


def apply_rows(word: str, index: dict, rows: list) -> list:
    """Apply one word's ``(page_id, positions, offset, rank)`` rows to its ``index`` in offset order.

    ``index`` ({str(page_id): positions}) is updated in place; returns the
    ``(offset, rank, word, json change record)`` output rows.

    >>> index = {}
    >>> [r[3] for r in apply_rows("cat", index, [(7, [2], 11, 0), (5, [0, 4], 10, 3), (7, [1], 12, 2)])]
    ['{"op":"add","word":"cat","page_id":5,"positions":[0,4],"df":1}', '{"op":"add","word":"cat","page_id":7,"positions":[2],"df":2}', '{"op":"add","word":"cat","page_id":7,"positions":[1],"df":2}']
    >>> index
    {'5': [0, 4], '7': [1]}
    """
    out = []
    for page, positions, offset, rank in sorted(rows, key=lambda r: r[2]):
        positions = positions.tolist() if hasattr(positions, "tolist") else list(positions)  # numpy from pandas
        page = int(page)
        index[str(page)] = positions
        out.append((int(offset), int(rank), word, _dumps({"op": "add", "word": word, "page_id": page, "positions": positions, "df": len(index)})))
    return out


def expected_records(documents: Sequence[dict]) -> list[dict]:
    """The change records for ``documents`` applied in order (pure Python; what the query must output)."""
    index: dict[str, dict] = {}
    out = []
    for doc in documents:
        for word, positions in word_positions(doc.get("text") or "").items():
            pages = index.setdefault(word, {})
            pages[int(doc["page_id"])] = positions
            out.append({"op": "add", "word": word, "page_id": int(doc["page_id"]), "positions": positions, "df": len(pages)})
    return out


# ------------------------------------------------------------------ the Spark query


def _index_pandas(key, pdfs, state):
    """applyInPandasWithState function: one word's rows of the micro-batch -> its change records."""
    import pandas as pd

    word = key[0]
    index = json.loads(state.get[0]) if state.exists else {}
    rows: list = []
    for pdf in pdfs:
        rows.extend(zip(pdf["page_id"].tolist(), pdf["positions"].tolist(), pdf["offset"].tolist(), pdf["rank"].tolist()))
    out = apply_rows(word, index, rows)
    state.update((_dumps(index),))
    yield pd.DataFrame(out, columns=["offset", "rank", "key", "value"])


def _tws_processor():
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class IndexProcessor(StatefulProcessor):
        """transformWithState (row API): the same logic, the index in a ValueState."""

        def init(self, handle) -> None:
            self.index = handle.getValueState("index", STATE_SCHEMA)

        def handleInputRows(self, key, rows, timerValues):
            word = key[0]
            v = self.index.get()
            index = json.loads(v[0]) if v is not None else {}
            out = apply_rows(word, index, [(r.page_id, r.positions, r.offset, r.rank) for r in rows])
            self.index.update((_dumps(index),))
            for offset, rank, k, value in out:
                yield Row(offset=offset, rank=rank, key=k, value=value)

        def close(self) -> None:
            pass

    return IndexProcessor()


def _split_arrow(batches):
    import pyarrow as pa

    types = [pa.string(), pa.int64(), pa.list_(pa.int32()), pa.int64(), pa.int32()]
    names = ["word", "page_id", "positions", "offset", "rank"]
    for b in batches:
        rows = [r for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist()) for r in split_document(o, v)]
        cols = list(zip(*rows)) if rows else [[] for _ in names]
        yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, types)], names=names)


def build_query(spark, bootstrap: str, input_topic: str, output_topic: str, checkpoint: str, trigger: str = "100ms",
                api: str = DEFAULTS["api"], split: str = DEFAULTS["split"]):
    """Start the streaming query on ``spark``; returns the StreamingQuery."""
    from driftstream.examples.inverted_index.spark_kafka import FORMAT, KafkaDataSource
    from pyspark.sql import functions as F

    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {sorted(TRIGGERS)}, not {trigger!r}")
    spark.dataSource.register(KafkaDataSource)
    src = (
        spark.readStream.format(FORMAT)
        .option("bootstrap.servers", bootstrap)
        .option("topic", input_topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    if split == "udf":
        split_udf = F.udf(_split_rows, returnType=SPLIT_TYPE)
        words = src.select(F.explode(split_udf("offset", "value")).alias("w")).select("w.*")
    elif split == "arrow":
        words = src.select("offset", "value").mapInArrow(_split_arrow, WORDS_SCHEMA)
    else:
        raise ValueError(f"split must be 'udf' or 'arrow', not {split!r}")
    grouped = words.groupBy("word")
    if api == "pandas":
        from pyspark.sql.streaming.state import GroupStateTimeout

        out = grouped.applyInPandasWithState(_index_pandas, OUT_SCHEMA, STATE_SCHEMA, "Append", GroupStateTimeout.NoTimeout)
    elif api == "tws":
        out = grouped.transformWithState(_tws_processor(), OUT_SCHEMA, "Append", "None")
    else:
        raise ValueError(f"api must be 'pandas' or 'tws', not {api!r}")
    return (
        out.writeStream.format(FORMAT)
        .option("bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("orderBy", "offset,rank")
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=TRIGGERS[trigger])
        .queryName("inverted_index")
        .start()
    )


# ------------------------------------------------------------------ the Spark session

#: Errors only; PySpark's gateway logger at the root's level, else Spark (taking PySpark for a shell) prints
#: 'Setting default log level to "WARN"' on every start (corpus._log4j_conf).
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.shell.name = org.apache.spark.api.python.PythonGatewayServer
logger.shell.level = error
"""


def _java_home() -> Optional[str]:
    """JAVA_HOME, or the installation of the ``java`` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    return str(Path(os.path.realpath(java)).parent.parent) if java else None


def spark_session(shuffle_partitions: int = DEFAULTS["shuffle_partitions"], state_store: str = DEFAULTS["state_store"],
                  conf: Sequence[tuple[str, str]] = (), log_dir: Optional[str] = None):
    """A local[2] SparkSession configured for low per-batch latency (module docstring)."""
    home = _java_home()
    if home:
        os.environ["JAVA_HOME"] = home
    # Python workers run this interpreter (where driftstream is installed); loopback only.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_dir = log_dir or tempfile.mkdtemp(prefix="driftstream-spark-")
    log4j = Path(log_dir) / "log4j2.properties"
    log4j.write_text(LOG4J2)

    from pyspark.sql import SparkSession

    if state_store not in STATE_STORES:
        raise ValueError(f"state_store must be one of {sorted(STATE_STORES)}, not {state_store!r}")
    b = (
        SparkSession.builder.master("local[2]")
        .appName("driftstream-inverted-index-baseline")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", "2")
        .config("spark.locality.wait", "0s")
        .config("spark.python.worker.reuse", "true")
        .config("spark.shuffle.compress", "false")
        .config("spark.shuffle.spill.compress", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.streaming.stateStore.providerClass", STATE_STORES[state_store])
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in conf:
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def warm_up(spark, api: str = DEFAULTS["api"]) -> None:
    """Run the query's Python code once as a batch job on both cores (split UDF + stateful function).

    Forks and warms the Python workers (Spark reuses them), so the first
    micro-batch does not pay for it.
    """
    from pyspark.sql import functions as F

    docs = [(i, _dumps({"page_id": i, "title": "", "text": "warm up", "sent_at_ms": 0.0})) for i in range(4)]
    df = spark.createDataFrame(docs, "offset long, value string").repartition(2)
    words = df.select(F.explode(F.udf(_split_rows, returnType=SPLIT_TYPE)("offset", "value")).alias("w")).select("w.*")
    grouped = words.groupBy("word")
    if api == "tws":
        grouped.transformWithState(_tws_processor(), OUT_SCHEMA, "Append", "None").collect()
    else:
        grouped.applyInPandas(lambda pdf: pdf[["word"]], "word string").collect()


# ------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.spark_baseline", description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers HOST:PORT")
    ap.add_argument("--input-topic", required=True)
    ap.add_argument("--output-topic", required=True)
    ap.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (offsets, commits, state)")
    ap.add_argument("--trigger", choices=sorted(TRIGGERS), default="100ms", help="processing-time trigger interval")
    ap.add_argument("--run-seconds", type=float, default=None, help="stop after this many seconds (default: until SIGTERM/SIGINT)")
    ap.add_argument("--api", choices=["pandas", "tws"], default=DEFAULTS["api"], help="applyInPandasWithState or transformWithState")
    ap.add_argument("--split", choices=["udf", "arrow"], default=DEFAULTS["split"], help="split documents with a Python UDF or mapInArrow")
    ap.add_argument("--state-store", choices=sorted(STATE_STORES), default=DEFAULTS["state_store"])
    ap.add_argument("--shuffle-partitions", type=int, default=DEFAULTS["shuffle_partitions"])
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration")
    ap.add_argument("--log-progress", action="store_true", help="print every micro-batch's progress (JSON) to stderr")
    ap.add_argument("--no-warm-up", action="store_true", help="skip the warm-up job")
    args = ap.parse_args(argv)
    if args.api == "tws" and args.state_store != "rocksdb":
        ap.error("--api tws needs --state-store rocksdb")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()

    conf = [tuple(c.split("=", 1)) for c in args.conf]
    with tempfile.TemporaryDirectory(prefix="driftstream-spark-") as log_dir:
        return _run(args, conf, log_dir, stop, parent)


def _run(args, conf: list, log_dir: str, stop: threading.Event, parent: int) -> int:
    spark = spark_session(args.shuffle_partitions, args.state_store, conf, log_dir=log_dir)
    query = None
    failed = None
    try:
        if not args.no_warm_up:
            warm_up(spark, args.api)
        query = build_query(spark, args.bootstrap, args.input_topic, args.output_topic, args.checkpoint, args.trigger, args.api, args.split)
        while query.lastProgress is None and not stop.is_set():
            if not query.isActive:
                break
            time.sleep(0.02)
        if query.isActive and not stop.is_set():
            print("READY", flush=True)
        deadline = None if args.run_seconds is None else time.time() + args.run_seconds
        logged = -1
        while not stop.is_set() and query.isActive:
            if args.log_progress:
                pr = query.lastProgress
                if pr is not None and pr["batchId"] > logged and pr["numInputRows"]:
                    logged = pr["batchId"]
                    print("PROGRESS " + _dumps({"batch": pr["batchId"], "rows": pr["numInputRows"], **pr["durationMs"]}), file=sys.stderr, flush=True)
            if deadline is not None and time.time() >= deadline:
                break
            if os.getppid() != parent:  # whoever started us is gone: do not linger as an orphan JVM
                break
            stop.wait(0.2)
        failed = query.exception()
    finally:
        if query is not None:
            try:
                query.stop()
            except Exception as exc:  # pragma: no cover - best effort on the way out
                print(f"stopping the query: {exc}", file=sys.stderr)
        spark.stop()
    if failed is not None:
        print(f"the streaming query failed: {failed}", file=sys.stderr, flush=True)
        return 1
    return 0


# ------------------------------------------------------------------ subprocess handle


class SparkBaselineHandle:
    """The running baseline CLI (a subprocess in its own session: Python driver, Spark JVM, Python workers)."""

    def __init__(self, proc: subprocess.Popen, stdout: deque, stderr: deque) -> None:
        self.process = proc
        self._stdout = stdout
        self._stderr = stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._stderr)[-lines:])

    def stop(self, timeout: float = 60.0) -> Optional[int]:
        """SIGTERM (the query and the SparkSession stop cleanly), wait, then kill the process group."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
        else:
            self._kill_group()  # the driver is gone; make sure its JVM and workers are too
        return self.process.returncode

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def __enter__(self) -> "SparkBaselineHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _drain(stream, sink: deque, ready: Optional[threading.Event] = None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        sink.append(line)
        if ready is not None and line.strip() == "READY":
            ready.set()
    stream.close()


def start_spark_baseline(
    bootstrap_servers: str,
    input_topic: str,
    output_topic: str,
    checkpoint_dir: str,
    trigger: str = "100ms",
    python: str = sys.executable,
    startup_timeout: float = 180,
    extra_args: Sequence[str] = (),
) -> SparkBaselineHandle:
    """Run the baseline CLI as a subprocess and return once it printed READY.

    Raises RuntimeError (with the tail of its stderr) if it exits first, and
    TimeoutError if it is not ready within ``startup_timeout`` seconds (it is
    stopped then). ``extra_args``: more CLI flags (tuning experiments).
    """
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {sorted(TRIGGERS)}, not {trigger!r}")
    cmd = [
        python, "-m", "driftstream.examples.inverted_index.spark_baseline",
        "--bootstrap", bootstrap_servers, "--input-topic", input_topic, "--output-topic", output_topic,
        "--checkpoint", checkpoint_dir, "--trigger", trigger, *extra_args,
    ]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out: deque = deque(maxlen=1000)
    err: deque = deque(maxlen=400)
    ready = threading.Event()
    threading.Thread(target=_drain, args=(proc.stdout, out, ready), daemon=True, name="spark-baseline-stdout").start()
    threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True, name="spark-baseline-stderr").start()
    handle = SparkBaselineHandle(proc, out, err)
    deadline = time.time() + startup_timeout
    while not ready.wait(0.1):
        if proc.poll() is not None:
            time.sleep(0.2)  # let the stderr reader catch up
            handle.stop()
            raise RuntimeError(f"the Spark baseline exited with code {proc.returncode} before READY; stderr tail:\n{handle.stderr_tail()}")
        if time.time() > deadline:
            handle.stop(timeout=20)
            raise TimeoutError(f"the Spark baseline was not READY within {startup_timeout}s; stderr tail:\n{handle.stderr_tail()}")
    return handle


if __name__ == "__main__":
    sys.exit(main())
