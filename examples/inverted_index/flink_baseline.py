"""The inverted index as a PyFlink DataStream job: the Flink baseline, exactly-once.

Same workload as the driftstream pipeline: documents ``{"page_id", "text"}``; every
document yields, for each of its distinct words, in order of first occurrence::

    {"op": "add", "word": w, "page_id": p, "positions": [...], "df": n}

where ``df`` is the number of distinct pages holding ``w`` after the change.

Job
---
``FileSource`` (text lines, one JSON document per line) -> ``flat_map`` splits a
document into ``(word, page_id, positions JSON)`` with :func:`documents.word_positions`
-> ``key_by(word)`` -> a ``KeyedProcessFunction`` whose state is the word's posting
list in Flink keyed state (``MapState`` page_id -> positions, ``ValueState`` df) and
which emits the change record as compact JSON -> ``FileSink`` (row format,
``OnCheckpointRollingPolicy``): a part file is renamed from its hidden in-progress
name to its final name only when the checkpoint that covers it completes. With
checkpointing ``EXACTLY_ONCE``, that is Flink's exactly-once output: a reader that
ignores hidden files sees each record exactly once, one checkpoint after it was made.
Parallelism 2 (one slot per core).

Two modes, both in ``STREAMING`` execution mode with checkpointing:

- ``backlog``: all documents are in input files (100 per file; a text file is one
  split, so 2+ files are needed for both readers to work) before the job starts; the
  source is bounded, so the job ends after the final checkpoint at end of input
  (Flink 2 checkpoints after tasks finish), which commits the last part files.
- ``latency``: the source monitors its directory continuously; the driver's feeder
  writes each document as its own file under a hidden name and ``os.rename`` s it in
  at a fixed rate. A warm-up document (page -1, a word of its own, left out of the
  figures) must come out before the feed starts, so JVM start, Python workers and the
  first checkpoint are not counted.

The driver (:func:`run_flink_backlog`, :func:`run_flink_latency`; no pyflink needed)
runs the job as a subprocess under an interpreter that has pyflink, in its own process
group (the mini cluster's JVM and the Python workers included), killed on every path.
It polls the output directory for finished part files and takes, for each document,
the time all its change records were visible. Flink reads the files in parallel, so
the documents are applied in no fixed order and ``df`` values differ from the
sequential reference: :func:`check_changes` checks what holds for any order.

Install (apache-flink 2.3.0 pins py4j 0.10.9.7 and, through apache-beam 2.61,
pyarrow<17, numpy<2.2, pandas<2.3, protobuf<6: it downgrades driftstream's test
dependencies, so it gets its own interpreter)::

    python3 -m venv .venv-flink          # in the checkout: found there, or set $DRIFTSTREAM_FLINK_PYTHON
    .venv-flink/bin/pip install apache-flink==2.3.0
    .venv-flink/bin/pip install --no-deps -e .

Configuration (chosen by measurement; 2 cores shared with other work, load 4-14)
--------------------------------------------------------------------------------
Compared by the CPU seconds of the job's process tree (JVM and Python workers,
sampled from ``/proc``; a 20-document run costs 9.6 CPU-s: JVM and mini cluster start)
and by the wall time from the first output to the end, one run each:

- ``python.execution-mode: thread`` (CPython embedded in the JVM by pemja) over
  ``process`` (Beam workers over gRPC): 300 documents, 11.7 vs 40.6 CPU-s, 3.7 vs
  25.8 s after the first output. In process mode every state access is a round trip
  to the JVM's state service, and the per-word keying makes them many (four per
  record here). Process mode also held the checkpoint barrier behind the whole
  backlog (checkpoint 2 took 20 s), so one commit at the end. Thread mode needs
  the venv's site-packages on ``PYTHONPATH`` (:func:`_embedded_python_path`).
- ``hashmap`` state backend over ``rocksdb`` (incremental checkpoints): 1,000
  documents, 14.5 vs 15.6 CPU-s, 4.5 vs 11.5 s after the first output (RocksDB
  checkpoints took 1.4-4.9 s instead of 0.5-1.2 s); 3,000: 237 vs 156 docs/s after
  the first output. The state here stays small (~0.5 M postings for 10,000 documents).
- ``monitor_continuously`` every 50 ms (latency, 50 ms checkpoints, 300 documents
  at 50 docs/s): p50/p99 101/229 ms, vs 145/422 ms at 10 ms (more listing on a
  busy machine) and 241/424 ms at 200 ms.
- Aligned checkpoints (the default): in a backlog a barrier waits behind the
  buffered records, so a checkpoint takes ~1-2 s and output commits every 2-3 s.
- ``restart-strategy.type: none``: a failure ends the run (with checkpointing Flink
  would otherwise restart forever); the figures are for failure-free runs.

Measured (this machine, load average 8-15 from other work, so rough): backlog,
1 s checkpoints: 3,000 documents 242 docs/s after the first output (36.7 s from
launch, of which 24 s before the first output); 10,000 documents 262 docs/s after
the first output, 193 docs/s from launch (9,500 records/s). Latency at 50 docs/s,
1,000 documents (the first 200 left out): 1 s checkpoints p50/p99 635/1166 ms;
50 ms checkpoints p50/p99 161/304 ms.

CLI::

    python -m driftstream.examples.inverted_index.flink_baseline backlog --docs 3000 --checkpoint-interval 1
    python -m driftstream.examples.inverted_index.flink_baseline latency --docs 1000 --rate 50 --checkpoint-interval 0.05

prints the figures as JSON (``job ...`` is the subprocess's own entry point).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from driftstream.examples.flink_job import (
    FLINK_PYTHON_ENV,
    Feeder,
    FlinkJob,
    PartFiles,
    die_with_parent,
    feed_when_warm,
    flink_python,
    job_settings,
)
from driftstream.examples.inverted_index.document_files import document_line, write_documents
from driftstream.examples.inverted_index.documents import page_of_line, word_positions
from driftstream.examples.inverted_index.throughput import summary  # the figures every engine of a throughput run reports
#: The configuration the measurements chose (module docstring).
DEFAULTS = dict(state_backend="hashmap", execution_mode="thread", discovery_interval=0.05)
#: The job's module: the driver runs ``python -m MODULE job ...`` under Flink's interpreter.
MODULE = "driftstream.examples.inverted_index.flink_baseline"
#: The warm-up document of a latency run: a page and a word of its own, so no other word's df moves.
WARMUP = {"page_id": -1, "text": "driftstreamflinkwarmup"}


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


# ------------------------------------------------------------------ the job (runs under pyflink)


def split_document(line: str) -> list[tuple]:
    """One input line (a JSON document) -> ``(word, page_id, positions JSON)`` per distinct word, in order.

    >>> split_document('{"page_id": 3, "text": "The cat saw the Cat."}')
    [('the', 3, '[0,3]'), ('cat', 3, '[1,4]'), ('saw', 3, '[2]')]
    """
    doc = json.loads(line)
    page = int(doc["page_id"])
    # Positions travel and stay in state as their JSON text: the record is built by
    # formatting, with no list (de)serialization between the Python workers and the JVM.
    return [(w, page, _dumps(p)) for w, p in word_positions(doc.get("text") or "").items()]


def change_record(word: str, page: int, positions: str, df: int) -> str:
    """The compact JSON change record (``positions`` already JSON), as ``json.dumps(..., separators=(",", ":"))``.

    >>> change_record("café", 3, "[1,4]", 2) == _dumps({"op": "add", "word": "café", "page_id": 3, "positions": [1, 4], "df": 2})
    True
    """
    return '{"op":"add","word":%s,"page_id":%d,"positions":%s,"df":%d}' % (json.dumps(word), page, positions, df)


def _index_update_function():
    """The ``KeyedProcessFunction`` class (made here: the driver imports this module without pyflink)."""
    from pyflink.common import Types
    from pyflink.datastream import KeyedProcessFunction
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    class IndexUpdate(KeyedProcessFunction):
        """A word's posting list in keyed state: MapState page_id -> positions, ValueState df."""

        def open(self, runtime_context) -> None:
            self.postings = runtime_context.get_map_state(MapStateDescriptor("postings", Types.LONG(), Types.STRING()))
            self.df = runtime_context.get_state(ValueStateDescriptor("df", Types.INT()))

        def process_element(self, value, ctx):
            word, page, positions = value
            n = self.df.value() or 0
            if not self.postings.contains(page):  # a page sent again replaces its positions
                n += 1
                self.df.update(n)
            self.postings.put(page, positions)
            yield change_record(word, page, positions, n)

    return IndexUpdate


def _embedded_python_path(directory: Path) -> None:
    """Make this venv's packages and driftstream's examples importable by the CPython the JVM embeds (thread mode).

    pemja's interpreter neither sees a venv's site-packages nor runs its ``.pth`` files
    (where an editable install hooks in), so ``PYTHONPATH`` (inherited by the JVM) gets
    the site-packages and a directory where ``driftstream/examples`` links to the
    examples' source (``driftstream`` is a namespace package)."""
    import site

    import driftstream.examples

    link = directory / "driftstream" / "examples"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(Path(driftstream.examples.__file__).resolve().parent, target_is_directory=True)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(directory), *site.getsitepackages(), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def run_job(
    input_dir: str,
    output_dir: str,
    checkpoint_dir: str,
    *,
    mode: str,
    checkpoint_interval: float,
    parallelism: int = 2,
    state_backend: str = DEFAULTS["state_backend"],
    execution_mode: str = DEFAULTS["execution_mode"],
    discovery_interval: float = DEFAULTS["discovery_interval"],
    extra: Sequence[str] = (),
) -> None:
    """Build and run the job on a local mini cluster (blocks; a backlog job ends after its input, a latency job never)."""
    from pyflink.common import Configuration, Duration, Encoder, Types, WatermarkStrategy
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import (
        BucketAssigner,
        FileSink,
        FileSource,
        RollingPolicy,
        StreamFormat,
    )

    if execution_mode == "thread":
        _embedded_python_path(Path(checkpoint_dir).parent / "pythonpath")
    conf = Configuration()
    settings = job_settings(checkpoint_dir, checkpoint_interval, parallelism, state_backend, **{
        "python.execution-mode": execution_mode,
        # The workers the JVM starts must be this interpreter (the one with pyflink and driftstream).
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
    }, extra=extra)  # fmt: skip
    for k, v in settings.items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    env.set_parallelism(parallelism)

    builder = FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(Path(input_dir).resolve()))
    if mode == "latency":
        builder = builder.monitor_continuously(Duration.of_millis(max(1, round(discovery_interval * 1000))))
    source = builder.build()
    sink = (
        FileSink.for_row_format(str(Path(output_dir).resolve()), Encoder.simple_string_encoder())
        .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner())
        .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy())
        .build()
    )
    words = env.from_source(source, WatermarkStrategy.no_watermarks(), "documents").flat_map(
        split_document, output_type=Types.TUPLE([Types.STRING(), Types.LONG(), Types.STRING()])
    )
    changes = words.key_by(lambda t: t[0], key_type=Types.STRING()).process(_index_update_function()(), output_type=Types.STRING())
    changes.sink_to(sink)
    env.execute(f"inverted-index-{mode}")


# ------------------------------------------------------------------ correctness (pure)


def check_changes(records: Iterable[dict], docs: Sequence[dict]) -> list[str]:
    """What must hold of the change records of ``docs`` applied in any order; returns the problems (none: correct).

    The set of ``(word, page_id, positions)`` equals the sequential reference's, no record
    comes twice, and each word's ``df`` values are exactly ``1..n`` (``n`` pages hold it).
    Pages must be distinct (every benchmark page is sent once).

    >>> docs = [{"page_id": 1, "text": "a b"}, {"page_id": 2, "text": "b"}]
    >>> out = [{"op": "add", "word": "b", "page_id": 2, "positions": [0], "df": 1},
    ...        {"op": "add", "word": "a", "page_id": 1, "positions": [0], "df": 1},
    ...        {"op": "add", "word": "b", "page_id": 1, "positions": [1], "df": 2}]
    >>> check_changes(out, docs)
    []
    >>> check_changes(out[:2], docs)
    ['1 record(s) missing, e.g. b page 1 [1]', "word 'b': df values [1], expected 1..2"]
    """
    problems: list[str] = []
    pages = Counter(int(d["page_id"]) for d in docs)
    repeated = [p for p, n in pages.items() if n > 1]
    if repeated:
        problems.append(f"{len(repeated)} page id(s) repeat (the order-free check needs distinct pages), e.g. {repeated[:3]}")
    want: set = set()
    for d in docs:
        for w, p in word_positions(d.get("text") or "").items():
            want.add((w, int(d["page_id"]), tuple(p)))
    got: Counter = Counter()
    dfs: dict = defaultdict(list)
    bad_op = 0
    for r in records:
        if r.get("op") != "add":
            bad_op += 1
        got[(r["word"], int(r["page_id"]), tuple(r["positions"]))] += 1
        dfs[r["word"]].append(r["df"])
    if bad_op:
        problems.append(f"{bad_op} record(s) with an op other than 'add'")
    twice = [k for k, n in got.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} record(s) more than once, e.g. {_show(twice[0])}")
    missing = sorted(want - set(got))
    if missing:
        problems.append(f"{len(missing)} record(s) missing, e.g. {_show(missing[0])}")
    extra = sorted(set(got) - want)
    if extra:
        problems.append(f"{len(extra)} unexpected record(s), e.g. {_show(extra[0])}")
    n_word = Counter(w for w, _, _ in want)
    wrong = [w for w in sorted(set(n_word) | set(dfs)) if sorted(dfs.get(w, [])) != list(range(1, n_word.get(w, 0) + 1))]
    if wrong:
        w = wrong[0]
        problems.append(
            f"word {w!r}: df values {sorted(dfs.get(w, []))[:10]}, expected 1..{n_word.get(w, 0)}"
            + (f" ({len(wrong)} words wrong)" if len(wrong) > 1 else "")
        )
    return problems


def _show(key: tuple) -> str:
    return f"{key[0]} page {key[1]} {list(key[2])}"


# ------------------------------------------------------------------ the driver (no pyflink needed)


class DocumentOutput:
    """The change records of a job's output ``files`` as they appear, and when each document's
    last one did. ``files``: :class:`.PartFiles` with ``parse=bytes``, or any object with its
    ``poll()`` (the JSON lines new since the last call, as bytes) and ``first_output``. Lines
    are decoded only by :meth:`records`, after the run (see :func:`.documents.page_of_line`)."""

    def __init__(self, files: Any, docs: Sequence[dict]) -> None:
        self.files = files
        self.want = {int(d["page_id"]): len(word_positions(d.get("text") or "")) for d in docs}
        self.got: Counter = Counter()
        self.visible: dict[int, float] = {}  # page_id -> time its last record became visible
        self.lines: list = []

    @property
    def first_output(self) -> Optional[float]:
        return self.files.first_output

    def poll(self) -> int:
        """Take the lines that appeared since the last call; returns their number."""
        now = time.time()
        new = self.files.poll()
        self.lines += new
        for line in new:
            page = page_of_line(line)
            self.got[page] += 1
            if self.got[page] == self.want.get(page, -1):
                self.visible[page] = now
        return len(new)

    def records(self) -> list:
        """Every record seen, decoded. O(records)."""
        return [json.loads(line) for line in self.lines]

    def complete(self) -> bool:
        return len(self.visible) == len(self.want)

    def backlog_figures(self, engine: str, docs: Sequence[dict], job: Any, problems: list, **fields: Any) -> dict:
        """The figures of a backlog run of ``job`` (a finished :class:`.FlinkJob`) from what this
        output saw: :func:`.throughput.summary` with the order-free check, ``fields``, the job's
        CPU, the time after its first output, and each document's completion. O(records)."""
        first = self.first_output or job.launched
        completions = [(t, 1) for t in sorted(self.visible.values())]
        end = completions[-1][0] if completions else job.launched
        records = self.records()
        figures = summary(
            engine, len(docs), len(records), job.launched, completions, problems + check_changes(records, docs),
            **fields,
            cpu_seconds=job.cpu_seconds,  # of the job's processes, sampled every 0.5 s: a lower bound
            seconds_after_first_output=round(end - first, 2),
            first_output_after_s=round(first - job.launched, 2),
        )
        return {**figures, "completions": completions}


def _job_args(input_dir: Path, out_dir: Path, workdir: Path, mode: str, checkpoint_interval: float, parallelism: int, options: dict) -> list[str]:
    o = {**DEFAULTS, **options}
    return [
        "--mode", mode, "--input", str(input_dir), "--output", str(out_dir), "--checkpoints", str(workdir / "checkpoints"),
        "--checkpoint-interval", str(checkpoint_interval), "--parallelism", str(parallelism),
        "--state-backend", o["state_backend"], "--execution-mode", o["execution_mode"],
        "--discovery-interval", str(o["discovery_interval"]),
        *[a for kv in o.get("conf", ()) for a in ("--conf", kv)],
    ]  # fmt: skip


def run_flink_backlog(
    docs: list,
    workdir: Path,
    *,
    parallelism: int = 2,
    checkpoint_interval: float = 1.0,
    python: Optional[str] = None,
    timeout: Optional[float] = None,
    **options,
) -> dict:
    """Run the job over ``docs`` already in files; returns the figures of
    :func:`.throughput.summary` (clock from the job's launch; a document is done when its
    records are all visible) and the check, plus ``seconds_after_first_output`` (from the
    first part file, in-progress included: the JVM's start left out) and ``completions``
    (``(time, 1)`` per document). ``options``: ``state_backend``, ``execution_mode`` (see
    ``DEFAULTS``)."""
    python = flink_python(python)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    files = write_documents(docs, workdir / "input")
    out = DocumentOutput(PartFiles(workdir / "output", parse=bytes), docs)
    problems: list[str] = []
    job = FlinkJob(python, workdir, MODULE, _job_args(workdir / "input", workdir / "output", workdir, "backlog", checkpoint_interval, parallelism, options))
    deadline = job.launched + (timeout if timeout is not None else 120 + len(docs) / 5)
    try:
        job.watch(out.poll, lambda: False, deadline)
        if job.running():
            problems.append(f"timed out after {time.time() - job.launched:.0f} s")
        rc = job.proc.poll()
        if rc not in (0, None):
            problems.append(f"job failed ({rc}): {job.tail()}")
    finally:
        job.stop()
    return out.backlog_figures(
        "flink", docs, job, problems,
        mode="backlog",
        files=files,
        parallelism=parallelism,
        checkpoint_interval=checkpoint_interval,
        **{k: options.get(k, v) for k, v in DEFAULTS.items() if k != "discovery_interval"},
        conf=list(options.get("conf", ())),
    )


def run_flink_latency(
    docs: list,
    workdir: Path,
    *,
    rate: float = 50.0,
    checkpoint_interval: float = 1.0,
    skip: int = 200,
    parallelism: int = 2,
    python: Optional[str] = None,
    warmup_timeout: float = 180.0,
    **options,
) -> dict:
    """Feed ``docs`` one file each at ``rate`` docs/s into the running job; latency = visible - renamed in.

    A document is visible when all its change records are in finished part files (the
    driver lists the output every ``flink_job.POLL_INTERVAL`` s). Percentiles over the documents
    after the first ``skip``. ``options``: ``state_backend``, ``execution_mode``,
    ``discovery_interval`` (see ``DEFAULTS``)."""
    from driftstream.engine.model.result import percentiles  # the driver's side: the job's interpreter has no engine

    python = flink_python(python)
    workdir = Path(workdir)
    inbox = workdir / "input"
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "warmup.json").write_text(document_line(WARMUP))
    out = DocumentOutput(PartFiles(workdir / "output", parse=bytes), [WARMUP, *docs])
    job = FlinkJob(python, workdir, MODULE, _job_args(inbox, workdir / "output", workdir, "latency", checkpoint_interval, parallelism, options))
    feeder = Feeder(inbox, [(f"doc-{i:06d}.json", document_line(d), i / rate) for i, d in enumerate(docs)])
    problems, ready = feed_when_warm(job, out.poll, lambda: WARMUP["page_id"] in out.visible, out.complete, feeder,
                                     warmup_timeout, len(docs) / rate + 30 + 10 * checkpoint_interval)  # fmt: skip
    if problems:
        return {"engine": "flink", "mode": "latency", "rate": rate, "correct": False, "problems": problems}
    renamed = {int(d["page_id"]): t for d, t in zip(docs, feeder.renamed) if t is not None}
    fed = sorted(renamed.values())
    achieved = (len(fed) - 1) / (fed[-1] - fed[0]) if len(fed) > 1 else 0.0
    order = [int(d["page_id"]) for d in docs]
    lat = [1000 * (out.visible[p] - renamed[p]) for p in order[skip:] if p in out.visible and p in renamed]
    missing = len(docs) - sum(1 for p in order if p in out.visible)
    if missing:
        problems.append(f"{missing} of {len(docs)} documents incomplete")
    problems += check_changes([r for r in out.records() if r["page_id"] != WARMUP["page_id"]], docs)
    return {
        "engine": "flink",
        "mode": "latency",
        "docs": len(docs),
        "rate": rate,
        "achieved_rate": round(achieved, 1),
        "checkpoint_interval": checkpoint_interval,
        "parallelism": parallelism,
        **{k: options.get(k, v) for k, v in DEFAULTS.items()},
        "conf": list(options.get("conf", ())),
        "ready_after_s": round(ready, 1),
        "cpu_seconds": job.cpu_seconds,
        "latency_ms": {k: round(v, 1) for k, v in percentiles(lat).items()},
        "correct": not problems,
        "problems": problems,
    }


# ------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.flink_baseline", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("backlog", "latency"):
        p = sub.add_parser(name)
        p.add_argument("--docs", type=int, default=3000 if name == "backlog" else 1000)
        p.add_argument("--checkpoint-interval", type=float, default=1.0)
        p.add_argument("--parallelism", "-p", type=int, default=2)
        p.add_argument("--python", default=None, help=f"interpreter with pyflink (default: this one if it has it, else ${FLINK_PYTHON_ENV})")
        p.add_argument("--workdir", default=None, help="keep the run's files here (default: a temporary directory, removed)")
        p.add_argument("--state-backend", default=DEFAULTS["state_backend"], choices=["hashmap", "rocksdb"])
        p.add_argument("--execution-mode", default=DEFAULTS["execution_mode"], choices=["process", "thread"])
        if name == "latency":
            p.add_argument("--rate", type=float, default=50.0)
            p.add_argument("--skip", type=int, default=200)
            p.add_argument("--discovery-interval", type=float, default=DEFAULTS["discovery_interval"])
        p.add_argument("--conf", action="append", default=[], help="KEY=VALUE Flink option (repeatable)")
    j = sub.add_parser("job", help="the job itself (run by the driver under the pyflink interpreter)")
    j.add_argument("--mode", choices=["backlog", "latency"], required=True)
    j.add_argument("--input", required=True)
    j.add_argument("--output", required=True)
    j.add_argument("--checkpoints", required=True)
    j.add_argument("--checkpoint-interval", type=float, default=1.0)
    j.add_argument("--parallelism", type=int, default=2)
    j.add_argument("--state-backend", default=DEFAULTS["state_backend"])
    j.add_argument("--execution-mode", default=DEFAULTS["execution_mode"])
    j.add_argument("--discovery-interval", type=float, default=DEFAULTS["discovery_interval"])
    j.add_argument("--conf", action="append", default=[], help="KEY=VALUE Flink option")
    args = ap.parse_args(argv)

    if args.command == "job":
        die_with_parent()
        run_job(args.input, args.output, args.checkpoints, mode=args.mode, checkpoint_interval=args.checkpoint_interval,
                parallelism=args.parallelism, state_backend=args.state_backend, execution_mode=args.execution_mode,
                discovery_interval=args.discovery_interval, extra=args.conf)  # fmt: skip
        return 0

    from driftstream.examples.benchmarks.backlog import documents

    # SIGTERM unwinds like Ctrl-C, so the runs' ``finally`` kills the job's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    docs = documents(args.docs)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"driftstream-flink-{args.command}-"))
    options = {"state_backend": args.state_backend, "execution_mode": args.execution_mode, "conf": args.conf}
    try:
        if args.command == "backlog":
            result = run_flink_backlog(docs, work, parallelism=args.parallelism, checkpoint_interval=args.checkpoint_interval, python=args.python, **options)
        else:
            result = run_flink_latency(docs, work, rate=args.rate, checkpoint_interval=args.checkpoint_interval, skip=args.skip,
                                       parallelism=args.parallelism, python=args.python,
                                       discovery_interval=args.discovery_interval, **options)  # fmt: skip
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result), flush=True)
    return 0 if result.get("correct") else 1


if __name__ == "__main__":
    # Run through the module's own name so the job's functions pickle by reference
    # (``__main__`` would be pickled by value into every Python worker).
    from driftstream.examples.inverted_index import flink_baseline

    sys.exit(flink_baseline.main())
