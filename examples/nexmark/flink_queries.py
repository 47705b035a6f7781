"""The Nexmark queries of :mod:`.queries` as Flink SQL on PyFlink's local mini cluster:
Flink's figures beside driftstream's in ``driftstream bench nexmark``.

The job (Table API, streaming mode, exactly-once checkpoints every 1 s, parallelism 2,
pure SQL: no Python worker) reads the same generated events as JSON lines (filesystem
source, json format) into one table ``events`` whose event time ``ts`` is each event's
``time`` (to the millisecond, floored: window bounds are whole seconds, so no event
changes window) with the watermark ``ts - delay``; views ``bids``, ``people`` and
``auctions`` split it by ``kind``. Each query is an ``INSERT`` into a filesystem sink of
its own (json): a part file is written under a hidden in-progress name, closed ("rolled")
by size or age (a json file does not roll on checkpoints as a bulk format's does), and
renamed in when the checkpoint after its closing commits: Flink's exactly-once output.
Several queries run as one statement set (one job).

How each query is written (Flink's strongest native operator for it):

- q1: a projection. The euro price is ``round(price * 0.908)`` in doubles with Python's
  rounding (half to even): Flink's ``ROUND`` rounds half up, so the SQL spells it out.
- q2: a filter, ``MOD(auction, 123) = 0``.
- q3: a regular inner join of ``auctions`` (category 10) and ``people`` (OR, ID, CA) on
  seller = id. Ours is a lookup, the seller as of the auction; the generator's sellers
  are always people created before the auction and a person never changes, so the join
  has the same rows (the tests check it against the simulator).
- q5: ``HOP`` (10 s every 2 s) counts per auction; as ours, a second stage gathers the
  counts of one sliding window by ``TUMBLE`` (2 s) over their ``window_time`` (end - 1 ms):
  their maximum (a window aggregate), a window join of the counts with it, and a window
  aggregate ``ARRAY_SORT(ARRAY_AGG(auction))`` of the tied auctions: one row per
  window with every auction that has the most bids, sorted as ``q5_row`` lists them.
  (Window Top-N would be shorter but takes ``ROW_NUMBER`` only: no ties.)
- q7: Window Top-N over ``TUMBLE`` (10 s): ``ROW_NUMBER() ... ORDER BY price DESC, time``
  = 1. A tie on the highest price goes to the earlier bid (ours: the first reduced).
- q8: window aggregates of ``people`` and of ``auctions`` per seller over ``TUMBLE``
  (10 s), then a window join on id = seller and the window: one row per person and
  window (Flink's own Nexmark q8).

Window bounds leave as seconds (``TIMESTAMPDIFF`` from the epoch, session time zone UTC)
so that rows compare with the simulator's: :func:`check_results` compares the two as
multisets (order-free; numbers as floats, lists in order).

Runs (the driver is this venv, the job runs under Flink's interpreter,
:mod:`driftstream.examples.flink_job`):

- :func:`run_flink_backlog`: every event already in files when the job starts, one file
  per source reader (event ``i`` in file ``i % 2``, as ours reads two partitions: each
  file in time order, so a watermark with no delay drops nothing, provided each reader
  takes one file, as both ask for a split when they start; a late event would show as a
  missing row). The bounded source ends the job and its final checkpoint commits the
  output. Figures: seconds and events/s from the launch to the last output committed
  (JVM, mini cluster and planning included), and two without that start:
  ``events_per_s_after_first_output`` (as the inverted index's Flink baseline): the
  events after the one that released the first result over the time from the first
  output file (in-progress included) to the last commit, an upper bound (the readers are
  ahead of the first output); ``events_per_s_from_reading``: all events over the time
  from the moment both source readers had their file (Flink's log) to the last commit.
- :func:`run_flink_latency`: the source monitors its directory every 50 ms; a feeder
  renames in a file of the events of each 0.1 s of event time when that time comes
  (``rate`` events/s), after a warm-up record (kind ``warmup``, a sink of its own) is
  out: JVM start, planning and the first checkpoint are behind. Files can be picked up
  several per listing, in no fixed order, so the watermark has a delay (0.5 s) and a
  source reader with nothing to read goes idle after 1 s; two flush records an hour of
  event time ahead close the last windows. Latency of a result: committed (visible in
  a finished part file, polled every 10 ms) - renamed in of the file of the event that
  released it: the event itself (q1-q3), or for a window the first event at least
  ``delay`` past its end, that is when the watermark could pass it (ours: from the
  watermark passing it, inside the engine). Part files roll every 0.1 s here. Flink's
  exactly-once output waits for the checkpoint's commit, so its latency is mostly the
  checkpoint interval (ours is to the sink's acknowledgement, before any snapshot:
  replay after a failure is deterministic, which gives the exactly-once).

CLI (figures as JSON; ``job ...`` is the subprocess's own entry point)::

    python -m driftstream.examples.nexmark.flink_queries backlog --events 50000 --event-rate 200 --queries q5
    python -m driftstream.examples.nexmark.flink_queries latency --rate 2000 --seconds 30 --queries q7

>>> print(_seconds("window_end"))
CAST(TIMESTAMPDIFF(SECOND, TIMESTAMP '1970-01-01 00:00:00', window_end) AS DOUBLE)
"""

from __future__ import annotations

import argparse
import bisect
import json
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Iterable, Optional, Sequence

from driftstream.examples.flink_job import Feeder, FlinkJob, PartFiles, die_with_parent, feed_when_warm, flink_python, job_settings

from .generator import events as generate

QUERIES = ("q1", "q2", "q3", "q5", "q7", "q8")
#: The job's module: the driver runs ``python -m MODULE job ...`` under Flink's interpreter.
MODULE = "driftstream.examples.nexmark.flink_queries"
#: Source readers (and files of a backlog): as ours, two partitions.
PARALLELISM = 2
#: Latency runs: the watermark's delay and a reader's idle timeout (seconds), the source's
#: listing interval, the event time each fed file holds.
LATENCY_DEFAULTS = dict(watermark_delay=0.5, idle_timeout=1.0, monitor_interval=0.05, file_interval=0.1)
#: The warm-up and flush records of a latency run (kinds no query reads; a flush's time is this far ahead).
WARMUP = {"kind": "warmup", "time": 0.0}
FLUSH_AHEAD = 3600.0
#: Latency runs: a sink's part file rolls (then commits with the next checkpoint) this long after it opened, checked as often.
ROLL_INTERVAL = 0.1


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


# ------------------------------------------------------------------ the SQL (runs under pyflink)


EVENT_COLUMNS = (
    "`kind` STRING, `id` BIGINT, `name` STRING, `email` STRING, `credit_card` STRING, `city` STRING, `state` STRING, "
    "`item` STRING, `initial_bid` BIGINT, `reserve` BIGINT, `expires` DOUBLE, `seller` BIGINT, `category` BIGINT, "
    "`auction` BIGINT, `bidder` BIGINT, `price` BIGINT, `channel` STRING, `time` DOUBLE"
)

#: Each query's sink columns: the keys of its rows in :mod:`.queries`.
SINK_COLUMNS = {
    "q1": "`auction` BIGINT, `bidder` BIGINT, `price` BIGINT, `time` DOUBLE",
    "q2": "`auction` BIGINT, `price` BIGINT",
    "q3": "`name` STRING, `city` STRING, `state` STRING, `auction` BIGINT",
    "q5": "`start` DOUBLE, `end` DOUBLE, `bids` BIGINT, `auctions` ARRAY<BIGINT>",
    "q7": "`start` DOUBLE, `end` DOUBLE, `auction` BIGINT, `bidder` BIGINT, `price` BIGINT",
    "q8": "`id` BIGINT, `name` STRING, `window_start` DOUBLE",
    "warmup": "`kind` STRING",
}


def _seconds(column: str) -> str:
    """A window bound (TIMESTAMP(3), UTC) as seconds from the epoch, as the simulator's rows have it."""
    return f"CAST(TIMESTAMPDIFF(SECOND, TIMESTAMP '1970-01-01 00:00:00', {column}) AS DOUBLE)"


def _hop_counts() -> str:
    return """SELECT window_end AS hop_end, window_time AS hop_time, auction, COUNT(*) AS num
        FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
        GROUP BY window_start, window_end, window_time, auction"""


#: Views a query needs besides ``bids``, ``people``, ``auctions`` (name -> SELECT).
VIEWS = {
    "q5": {
        "q5_counts": _hop_counts(),
        # The counts of one sliding window (same end) fall in one 2 s tumbling window of their window_time (end - 1 ms).
        "q5_max": """SELECT window_start, window_end, MAX(num) AS maxn
            FROM TABLE(TUMBLE(TABLE q5_counts, DESCRIPTOR(hop_time), INTERVAL '2' SECOND)) GROUP BY window_start, window_end""",
        "q5_top": """SELECT C.hop_end, C.hop_time, C.auction, C.num
            FROM (SELECT * FROM TABLE(TUMBLE(TABLE q5_counts, DESCRIPTOR(hop_time), INTERVAL '2' SECOND))) C
            JOIN q5_max M ON C.window_start = M.window_start AND C.window_end = M.window_end AND C.num = M.maxn""",
    },
    "q8": {
        "q8_people": """SELECT id, name, window_start, window_end
            FROM TABLE(TUMBLE(TABLE people, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY id, name, window_start, window_end""",
        "q8_sellers": """SELECT seller, window_start, window_end
            FROM TABLE(TUMBLE(TABLE auctions, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY seller, window_start, window_end""",
    },
}

#: Each query's SELECT, its columns in :data:`SINK_COLUMNS`'s order.
SELECTS = {
    # x = price * 0.908 in doubles, rounded half to even as Python's round() (Flink's ROUND is half up).
    "q1": """SELECT auction, bidder,
            CAST(FLOOR(x) AS BIGINT) + CASE WHEN x - FLOOR(x) > 0.5 OR (x - FLOOR(x) = 0.5 AND MOD(CAST(FLOOR(x) AS BIGINT), 2) = 1)
                                            THEN 1 ELSE 0 END, `time`
        FROM (SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908E0 AS x, `time` FROM bids)""",
    "q2": "SELECT auction, price FROM bids WHERE MOD(auction, 123) = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id FROM auctions A JOIN people P ON A.seller = P.id
        WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')""",
    "q5": f"""SELECT {_seconds("window_end")} - 10, {_seconds("window_end")}, MAX(num), ARRAY_SORT(ARRAY_AGG(auction))
        FROM TABLE(TUMBLE(TABLE q5_top, DESCRIPTOR(hop_time), INTERVAL '2' SECOND)) GROUP BY window_start, window_end""",
    "q7": f"""SELECT {_seconds("window_start")}, {_seconds("window_end")}, auction, bidder, price FROM (
            SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC, `time`) AS rn
            FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))) WHERE rn = 1""",
    "q8": f"""SELECT P.id, P.name, {_seconds("P.window_start")} FROM q8_people P JOIN q8_sellers A
        ON P.id = A.seller AND P.window_start = A.window_start AND P.window_end = A.window_end""",
    "warmup": "SELECT kind FROM events WHERE kind = 'warmup'",
}


def _ms_option(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))} ms"


def statements(input_dir: str, output_dir: str, queries: Sequence[str], *, watermark_delay: float = 0.0,
               monitor_interval: Optional[float] = None) -> list[str]:
    """The DDL and the ``INSERT`` s of a job running ``queries`` (``monitor_interval``: an unbounded source listing its directory).

    >>> s = statements("/in", "/out", ["q2"])
    >>> [x.split("(")[0].strip() for x in s][-1], sum(x.startswith("CREATE TEMPORARY VIEW") for x in s)
    ('INSERT INTO out_q2 SELECT auction, price FROM bids WHERE MOD', 3)
    """
    monitor = roll = ""
    if monitor_interval:
        monitor = f", 'source.monitor-interval' = '{_ms_option(monitor_interval)}'"
        # A json part file rolls by size or age only (not on checkpoints, as a bulk format's
        # does), and a rolled file commits with the next checkpoint: roll often.
        roll = "".join(f", 'sink.rolling-policy.{k}' = '{_ms_option(ROLL_INTERVAL)}'" for k in ("rollover-interval", "check-interval"))
    out = [
        f"""CREATE TABLE events ({EVENT_COLUMNS},
            ts AS TO_TIMESTAMP_LTZ(CAST(FLOOR(`time` * 1000) AS BIGINT), 3),
            WATERMARK FOR ts AS ts - INTERVAL '{watermark_delay:.3f}' SECOND)
        WITH ('connector' = 'filesystem', 'path' = '{Path(input_dir).resolve()}', 'format' = 'json'{monitor})""",
        "CREATE TEMPORARY VIEW bids AS SELECT auction, bidder, price, `time`, ts FROM events WHERE kind = 'bid'",
        "CREATE TEMPORARY VIEW people AS SELECT id, name, city, state, ts FROM events WHERE kind = 'person'",
        "CREATE TEMPORARY VIEW auctions AS SELECT id, seller, category, ts FROM events WHERE kind = 'auction'",
    ]
    for q in queries:
        out += [f"CREATE TEMPORARY VIEW {name} AS {select}" for name, select in VIEWS.get(q, {}).items()]
        out.append(f"""CREATE TABLE out_{q} ({SINK_COLUMNS[q]})
            WITH ('connector' = 'filesystem', 'path' = '{(Path(output_dir) / q).resolve()}', 'format' = 'json'{roll})""")
    return out + [f"INSERT INTO out_{q} {SELECTS[q]}" for q in queries]


def run_job(input_dir: str, output_dir: str, checkpoint_dir: str, queries: Sequence[str], *, checkpoint_interval: float = 1.0,
            parallelism: int = PARALLELISM, watermark_delay: float = 0.0, monitor_interval: Optional[float] = None,
            idle_timeout: Optional[float] = None, extra: Sequence[str] = ()) -> None:
    """Run ``queries`` as one statement set on a local mini cluster (blocks: a bounded source ends the job, a monitored one never)."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    more = {"table.local-time-zone": "UTC"}  # window bounds as UTC timestamps: seconds from the epoch by TIMESTAMPDIFF
    if idle_timeout:
        more["table.exec.source.idle-timeout"] = _ms_option(idle_timeout)
    for k, v in job_settings(checkpoint_dir, checkpoint_interval, parallelism, extra=extra, **more).items():
        env.get_config().set(k, v)
    job = env.create_statement_set()
    for statement in statements(input_dir, output_dir, queries, watermark_delay=watermark_delay, monitor_interval=monitor_interval):
        if statement.startswith("INSERT"):
            job.add_insert_sql(statement)
        else:
            env.execute_sql(statement)
    job.execute().wait()


# ------------------------------------------------------------------ correctness (pure)


def _canonical(value):
    """Numbers as floats (JSON from Flink writes ``10.0`` where the simulator has ``10``), dicts by key, lists in order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return [_canonical(v) for v in value]


def row_key(row: dict) -> str:
    """A result row as a comparable string: equal for equal rows, whatever engine wrote them.

    >>> row_key({"end": 10, "auctions": [3, 1]}) == row_key({"auctions": [3.0, 1.0], "end": 10.0})
    True
    """
    return json.dumps(_canonical(row), sort_keys=True)


def check_results(got: Iterable[dict], expected: Iterable[dict]) -> list[str]:
    """Flink's rows against the simulator's, as multisets (order-free); the problems (none: correct).

    >>> want = [{"auction": 1, "price": 5}, {"auction": 1, "price": 5}, {"auction": 2, "price": 7}]
    >>> check_results([want[2], want[0], want[1]], want)
    []
    >>> check_results(want[:2], want)
    ['1 row(s) missing, e.g. {"auction": 2.0, "price": 7.0}']
    >>> check_results(want + [want[2]], want)
    ['1 row(s) too many, e.g. {"auction": 2.0, "price": 7.0}']
    """
    have, want = Counter(map(row_key, got)), Counter(map(row_key, expected))
    problems = []
    for label, diff in (("missing", want - have), ("too many", have - want)):
        if diff:
            problems.append(f"{sum(diff.values())} row(s) {label}, e.g. {min(diff)}")
    return problems


def release_times(query: str, rows: Sequence[dict], evs: Sequence[dict]) -> list[float]:
    """For each expected row of ``query``, the event time whose arrival releases it: the
    event's own (q1 a bid, q2 the bid, q3 the auction), a window's end (q5, q7, q8: the
    watermark must pass it).

    >>> evs = [{"kind": "bid", "auction": 123, "price": 5, "time": 0.5}, {"kind": "bid", "auction": 123, "price": 5, "time": 0.7}]
    >>> release_times("q2", [{"auction": 123, "price": 5}] * 2, evs), release_times("q8", [{"window_start": 10.0}], evs)
    ([0.5, 0.7], [20.0])
    """
    if query in ("q5", "q7"):
        return [float(r["end"]) for r in rows]
    if query == "q8":
        return [float(r["window_start"]) + 10 for r in rows]
    if query == "q1":
        return [float(r["time"]) for r in rows]
    if query == "q3":
        opened = {e["id"]: e["time"] for e in evs if e["kind"] == "auction"}
        return [opened[r["auction"]] for r in rows]
    times = defaultdict(list)  # q2: the bids with that auction and price, in order
    for e in evs:
        if e["kind"] == "bid":
            times[(e["auction"], e["price"])].append(e["time"])
    used: Counter = Counter()
    out = []
    for r in rows:
        k = (r["auction"], r["price"])
        out.append(times[k][used[k]])
        used[k] += 1
    return out


def expected_results(query: str, evs: list) -> list:
    """The simulator's results of ``query`` over ``evs``, as JSON gives them back (the reference both engines are checked against)."""
    from .queries import build  # the driver's side: the job's interpreter has no engine

    return json.loads(json.dumps(build(query, evs).run(runtime="simulator", seed=1).output(query)))


# ------------------------------------------------------------------ the driver (no pyflink needed)


def write_event_files(evs: Sequence[dict], directory: Path, files: int = PARALLELISM) -> None:
    """Event ``i`` into ``events-{i % files}.json`` (a file is one split: one per source reader, each in time order)."""
    directory.mkdir(parents=True, exist_ok=True)
    for p in range(files):
        (directory / f"events-{p}.json").write_text("".join(_dumps(e) + "\n" for e in evs[p::files]))


class _Results:
    """Each query's committed rows as they appear, with the time each became visible."""

    def __init__(self, output_dir: Path, queries: Sequence[str]) -> None:
        self.files = {q: PartFiles(output_dir / q) for q in queries}
        self.rows: dict[str, list] = {q: [] for q in queries}
        self.visible: dict[str, list] = {q: [] for q in queries}
        self.last = 0.0  # when the last new rows were seen

    def poll(self) -> None:
        now = time.time()
        for q, files in self.files.items():
            new = files.poll()
            if new:
                self.rows[q] += new
                self.visible[q] += [now] * len(new)
                self.last = now

    def first_output(self) -> Optional[float]:
        return min((f.first_output for f in self.files.values() if f.first_output is not None), default=None)

    def at_least(self, counts: dict) -> bool:
        return all(len(self.rows[q]) >= n for q, n in counts.items())


def _job_args(workdir: Path, queries: Sequence[str], checkpoint_interval: float, parallelism: int, latency: Optional[dict], conf: Sequence[str],
              input_dir: Optional[Path] = None) -> list:
    args = ["--input", str(input_dir or workdir / "input"), "--output", str(workdir / "output"), "--checkpoints", str(workdir / "checkpoints"),
            "--queries", ",".join(queries), "--checkpoint-interval", str(checkpoint_interval), "--parallelism", str(parallelism),
            *[a for kv in conf for a in ("--conf", kv)]]  # fmt: skip
    if latency:
        args += ["--watermark-delay", str(latency["watermark_delay"]), "--monitor-interval", str(latency["monitor_interval"]),
                 "--idle-timeout", str(latency["idle_timeout"])]  # fmt: skip
    return args


class _JobLog:
    """What the mini cluster's log (``workdir/log``, in the JVM's local time, as ours) says of the run.

    >>> log = _JobLog.__new__(_JobLog)
    >>> log.lines = ["2026-11-27 16:15:03,842 INFO  x.SourceReaderBase [] - Adding split(s) to reader: [a]",
    ...              "2026-11-27 16:15:03,846 INFO  x.SourceReaderBase [] - Adding split(s) to reader: [b]",
    ...              "2026-11-27 16:15:04,372 INFO  x.CheckpointCoordinator [] - Completed checkpoint 1 for job f"]
    >>> log.checkpoints(), round(log.reading_started(2) - log.reading_started(1), 3)
    (1, 0.004)
    """

    def __init__(self, workdir: Path) -> None:
        self.lines = [line for f in sorted((workdir / "log").glob("*.log")) for line in f.read_text(errors="replace").splitlines()]

    def checkpoints(self) -> Optional[int]:
        """Completed checkpoints (None without a log)."""
        return sum("Completed checkpoint " in line for line in self.lines) if self.lines else None

    def reading_started(self, readers: int) -> Optional[float]:
        """When the last of ``readers`` source readers got its first file (epoch seconds): all are reading."""
        added = [line for line in self.lines if "Adding split(s) to reader" in line]
        if len(added) < readers:
            return None
        return round(datetime.strptime(added[readers - 1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), 3)


def _row(query: str, engine_mode: str, n: int, seconds: float, results: int, problems: list, **extra) -> dict:
    """A row of ``bench nexmark``'s table (the keys of ``bench.run_query``'s)."""
    return {"engine": "flink", "query": query, "events": n, "mode": engine_mode, "seconds": round(seconds, 2),
            "events_per_s": round(n / seconds, 1) if seconds > 0 else None, "results": results,
            "correct": not problems, "problems": problems[:10], **extra}  # fmt: skip


def run_flink_backlog(
    queries: Sequence[str],
    evs: list,
    workdir: Path,
    *,
    expected: Optional[dict] = None,
    parallelism: int = PARALLELISM,
    checkpoint_interval: float = 1.0,
    python: Optional[str] = None,
    timeout: Optional[float] = None,
    conf: Sequence[str] = (),
    input_dir: Optional[Path] = None,
) -> list[dict]:
    """One job runs ``queries`` over ``evs`` already in files; a row per query (all queries
    share the job's clock: run one query for its own figures). ``expected``: query ->
    the rows to check against (default: the simulator's, computed here). ``input_dir``: the
    events as :func:`write_event_files` wrote them (default: written here). Usage (needs
    Flink's interpreter)::

        rows = run_flink_backlog(["q5"], generate(50_000, rate=200), Path("/tmp/q5"))
        rows[0]["correct"], rows[0]["events_per_s_from_reading"]
    """
    python = flink_python(python)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    expected = expected if expected is not None else {q: expected_results(q, evs) for q in queries}
    if input_dir is None:
        write_event_files(evs, workdir / "input", parallelism)
    out = _Results(workdir / "output", queries)
    job = FlinkJob(python, workdir, MODULE, _job_args(workdir, queries, checkpoint_interval, parallelism, None, conf, input_dir))
    problems: list[str] = []
    try:
        job.watch(out.poll, lambda: False, job.launched + (timeout if timeout is not None else 180 + len(evs) / 500))
        if job.running():
            problems.append(f"timed out after {time.time() - job.launched:.0f} s")
        elif job.proc.returncode != 0:
            problems.append(f"job failed ({job.proc.returncode}): {job.tail(1500)}")
    finally:
        job.stop()
    first = out.first_output()
    end = out.last or time.time()
    log = _JobLog(workdir)
    reading = log.reading_started(parallelism)
    times = sorted(e["time"] for e in evs)
    rows = []
    for q in queries:
        # The events before the one that released the first result: read before any output could appear.
        released = min((bisect.bisect_left(times, t) for t in release_times(q, expected[q], evs)), default=0)
        after = end - first if first else 0.0
        rows.append(_row(q, "backlog", len(evs), end - job.launched, len(out.rows[q]), problems + check_results(out.rows[q], expected[q]),
                         events_per_s_after_first_output=round((len(evs) - released) / after, 1) if after > 0 else None,
                         first_output_after_s=round(first - job.launched, 2) if first else None,
                         events_per_s_from_reading=round(len(evs) / (end - reading), 1) if reading and end > reading else None,
                         reading_after_s=round(reading - job.launched, 2) if reading else None,
                         cpu_seconds=job.cpu_seconds, checkpoints=log.checkpoints(), p50_ms=None, p99_ms=None))  # fmt: skip
    return rows


def feed_chunks(evs: Sequence[dict], rate: float, interval: float) -> list[tuple]:
    """A latency run's input as ``(events, due)`` per ``interval`` s of events at ``rate``
    events/s, due when its last event's time comes (from the first event's): a file
    renamed in for Flink, a batch of records for ours (:mod:`.kafka_latency`).

    >>> [(len(c), d) for c, d in feed_chunks([{"time": i / 10} for i in range(5)], 10.0, 0.2)]
    [(2, 0.1), (2, 0.3), (1, 0.4)]
    """
    per_chunk = max(1, round(rate * interval))
    return [(list(evs[i : i + per_chunk]), (min(i + per_chunk, len(evs)) - 1) / rate) for i in range(0, len(evs), per_chunk)]


def feed_files(evs: Sequence[dict], rate: float, file_interval: float) -> list[tuple]:
    """The latency run's input: ``(name, text, due)`` per file of :func:`feed_chunks`; then
    two flush records (one per reader) an hour of event time ahead.

    >>> [(n, t.count(chr(10)), d) for n, t, d in feed_files([{"time": i / 10} for i in range(5)], 10.0, 0.2)][:3]
    [('events-000000.json', 2, 0.1), ('events-000001.json', 2, 0.3), ('events-000002.json', 1, 0.4)]
    """
    files = [(f"events-{k:06d}.json", "".join(_dumps(e) + "\n" for e in chunk), due) for k, (chunk, due) in enumerate(feed_chunks(evs, rate, file_interval))]
    flush = _dumps(flush_record(evs)) + "\n"
    last = files[-1][2] if files else 0.0
    return files + [(f"flush-{p}.json", flush, last) for p in range(PARALLELISM)]


def flush_record(evs: Sequence[dict]) -> dict:
    """The record that closes a latency run's last windows: an hour of event time past its last event."""
    return {"kind": "flush", "time": (evs[-1]["time"] if evs else 0.0) + FLUSH_AHEAD}


def result_latencies(query: str, expected: Sequence[dict], evs: Sequence[dict], rows: Sequence[dict], visible: Sequence[float],
                     arrived: Sequence[Optional[float]], per_chunk: int, flushed: Optional[float], delay: float = 0.0) -> list[float]:
    """Milliseconds from the input that released each result to the result visible, the same
    for every engine: ``rows`` seen at ``visible``; ``arrived[k]``: when chunk ``k`` of
    :func:`feed_chunks` (``per_chunk`` events) went in, ``flushed``: the flush records. A
    result's releasing event (:func:`release_times`, ``delay`` later for a window: a
    watermark's delay) is the first at or past that time; its chunk's arrival starts the
    clock. Equal rows take their anchors in order.

    >>> evs = [{"time": 0.0}, {"time": 0.5}, {"time": 1.0}]
    >>> result_latencies("q1", [{"time": 0.5}], evs, [{"time": 0.5}], [10.25], [10.0, 10.2], 2, 11.0)
    [250.0]
    """
    times = [e["time"] for e in evs]

    def released_at(t: float) -> Optional[float]:
        i = bisect.bisect_left(times, t)
        return arrived[i // per_chunk] if i < len(times) else flushed

    anchors: dict[str, list] = defaultdict(list)
    for row, t in zip(expected, release_times(query, expected, evs)):
        anchors[row_key(row)].append(released_at(t + delay))
    lat = []
    for row, seen in sorted(zip(rows, visible), key=lambda rv: rv[1]):
        waiting = anchors.get(row_key(row))
        if waiting:
            start = waiting.pop(0)
            if start is not None:
                lat.append(1000 * (seen - start))
    return lat


def run_flink_latency(
    query: str,
    evs: list,
    workdir: Path,
    *,
    rate: float,
    expected: Optional[list] = None,
    parallelism: int = PARALLELISM,
    checkpoint_interval: float = 1.0,
    python: Optional[str] = None,
    warmup_timeout: float = 180.0,
    conf: Sequence[str] = (),
    **options: float,
) -> dict:
    """The job of ``query`` running, ``evs`` fed at ``rate`` events/s (:func:`feed_files`);
    a result's latency = visible - its releasing event's file renamed in. ``options``:
    :data:`LATENCY_DEFAULTS`' keys. Usage (needs Flink's interpreter)::

        row = run_flink_latency("q7", generate(60_000, rate=2000), Path("/tmp/q7"), rate=2000)
        row["correct"], row["p50_ms"], row["p99_ms"]
    """
    from driftstream.engine.model.result import percentiles  # the driver's side: the job's interpreter has no engine

    python = flink_python(python)
    o = {**LATENCY_DEFAULTS, **options}
    workdir = Path(workdir)
    inbox = workdir / "input"
    inbox.mkdir(parents=True, exist_ok=True)
    expected = expected if expected is not None else expected_results(query, evs)
    (inbox / "warmup.json").write_text(_dumps(WARMUP) + "\n")
    files = feed_files(evs, rate, o["file_interval"])
    out = _Results(workdir / "output", [query, "warmup"])
    job = FlinkJob(python, workdir, MODULE, _job_args(workdir, [query, "warmup"], checkpoint_interval, parallelism, o, conf))
    feeder = Feeder(inbox, files)
    problems, ready = feed_when_warm(job, out.poll, lambda: out.at_least({"warmup": 1}), lambda: out.at_least({query: len(expected)}),
                                     feeder, warmup_timeout, len(evs) / rate + 60 + 10 * checkpoint_interval)  # fmt: skip
    fed = [t for t in feeder.renamed if t is not None]
    if not fed:
        return _row(query, f"{rate:g} events/s via files", len(evs), 0.0, len(out.rows[query]), problems, p50_ms=None, p99_ms=None)
    renamed = feeder.renamed[: len(files) - PARALLELISM]
    flushed = max((t for t in feeder.renamed[len(files) - PARALLELISM :] if t is not None), default=None)
    delay = o["watermark_delay"] if query in ("q5", "q7", "q8") else 0.0
    lat = result_latencies(query, expected, evs, out.rows[query], out.visible[query], renamed, max(1, round(rate * o["file_interval"])), flushed, delay)
    p = percentiles(lat)
    end = out.last if out.rows[query] else time.time()
    return _row(query, f"{rate:g} events/s via files", len(evs), end - fed[0], len(out.rows[query]), problems + check_results(out.rows[query], expected),
                p50_ms=_ms(p.get("p50")), p99_ms=_ms(p.get("p99")), max_ms=_ms(p.get("max")),
                achieved_rate=round((len(evs) - 1) / (fed[-1] - fed[0]), 1) if len(fed) > 1 and fed[-1] > fed[0] else None,
                ready_after_s=None if ready is None else round(ready, 1), cpu_seconds=job.cpu_seconds,
                checkpoints=_JobLog(workdir).checkpoints(), watermark_delay=o["watermark_delay"])  # fmt: skip


def _ms(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)


# ------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m driftstream.examples.nexmark.flink_queries", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("backlog", "latency"):
        p = sub.add_parser(name)
        p.add_argument("--queries", default=",".join(QUERIES))
        p.add_argument("--checkpoint-interval", type=float, default=1.0)
        p.add_argument("--parallelism", "-p", type=int, default=PARALLELISM)
        p.add_argument("--python", default=None, help="interpreter with pyflink (default: see driftstream.examples.flink_job)")
        p.add_argument("--workdir", default=None, help="keep the run's files here (default: a temporary directory, removed)")
        p.add_argument("--conf", action="append", default=[], help="KEY=VALUE Flink option (repeatable)")
        if name == "backlog":
            p.add_argument("--events", type=int, default=50_000)
            p.add_argument("--event-rate", type=float, default=200, help="events per second of event time")
        else:
            p.add_argument("--rate", type=float, default=2_000, help="events/s fed")
            p.add_argument("--seconds", type=float, default=30.0)
    j = sub.add_parser("job", help="the job itself (run by the driver under the pyflink interpreter)")
    for flag in ("--input", "--output", "--checkpoints", "--queries"):
        j.add_argument(flag, required=True)
    j.add_argument("--checkpoint-interval", type=float, default=1.0)
    j.add_argument("--parallelism", type=int, default=PARALLELISM)
    j.add_argument("--watermark-delay", type=float, default=0.0)
    j.add_argument("--monitor-interval", type=float, default=None)
    j.add_argument("--idle-timeout", type=float, default=None)
    j.add_argument("--conf", action="append", default=[])
    args = ap.parse_args(argv)

    if args.command == "job":
        die_with_parent()
        run_job(args.input, args.output, args.checkpoints, args.queries.split(","), checkpoint_interval=args.checkpoint_interval,
                parallelism=args.parallelism, watermark_delay=args.watermark_delay, monitor_interval=args.monitor_interval,
                idle_timeout=args.idle_timeout, extra=args.conf)  # fmt: skip
        return 0

    # SIGTERM unwinds like Ctrl-C, so the runs' ``finally`` kills the job's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    queries = [q for q in args.queries.split(",") if q]
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"nexmark-flink-{args.command}-"))
    common = dict(parallelism=args.parallelism, checkpoint_interval=args.checkpoint_interval, python=args.python, conf=args.conf)
    rows = []
    try:
        if args.command == "backlog":
            rows = run_flink_backlog(queries, generate(args.events, rate=args.event_rate), work, **common)
        else:
            evs = generate(int(args.rate * args.seconds), rate=args.rate)
            rows = [run_flink_latency(q, evs, work / q, rate=args.rate, **common) for q in queries]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
