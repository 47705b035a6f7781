"""The inverted index on Bytewax: a peer with a Rust core, on the same basis as the others.

Same workload and per-element work as :func:`.throughput.plain_loop`: documents
``{"page_id", "text"}`` as JSON lines; for each distinct word of a document, in order of
first occurrence, the change record ``{"op": "add", "word", "page_id", "positions", "df"}``
with ``df`` the number of pages holding the word after the change.

Job
---
``DirSource`` (the documents' files, those Spark and Flink read: each file a partition) -> ``map`` ``orjson.loads`` ->
``flat_map`` :func:`document_changes` (:func:`.documents.word_positions`, the driftstream
example's tokenizer) -> ``key_on`` word -> ``stateful_map`` :func:`index_step`, whose state
is the word's posting list, a dict page_id -> positions updated in place (the plain loop's
dict; Bytewax applies an element once, so no copy) -> the record as compact JSON ->
``DirSink`` of 2 files.

With ``snapshot_interval`` (1 s in the benchmark), Bytewax snapshots every step's state
into its SQLite recovery partitions at that interval, and ``DirSink`` truncates its files
back to the last snapshot on a resume: Bytewax's exactly-once for files. Its state model
snapshots a changed key's whole value, so a frequent word's posting list is pickled again
at each snapshot that changed it. Two processes (``-i``/``-a``), one worker each: Bytewax's
workers in one process share the interpreter lock.

The driver (:func:`run_bytewax_backlog`; no bytewax needed) runs the job (:func:`main`'s
``job``, which starts the two worker processes) under an interpreter that has bytewax, in
a process group of its own killed on every path, and follows the output files as they grow:
a record is counted when its line is written (the sink fsyncs each batch), which is before
the snapshot that covers it. Documents are applied in no fixed order across the two
partitions, so :func:`.flink_baseline.check_changes` checks what holds for any order.

Install (kept out of the default install, as Flink)::

    python3 -m venv .venv-bytewax          # in the checkout: found there, or set $DRIFTSTREAM_BYTEWAX_PYTHON
    .venv-bytewax/bin/pip install bytewax==0.21.1 orjson
    .venv-bytewax/bin/pip install --no-deps -e .

>>> index_step(None, ("a", 7, [0, 2]))
({7: [0, 2]}, '{"op":"add","word":"a","page_id":7,"positions":[0,2],"df":1}')
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from .documents import word_positions

BYTEWAX_PYTHON_ENV = "DRIFTSTREAM_BYTEWAX_PYTHON"
#: Where the setup above puts Bytewax's interpreter: a venv of its own beside the checkout's.
BYTEWAX_VENV = Path(__file__).resolve().parents[2] / ".venv-bytewax"
MODULE = "driftstream.examples.inverted_index.bytewax_baseline"
#: The first of the ports the worker processes talk on (one each).
BASE_PORT = 21021


# ------------------------------------------------------------------ the job's side (runs under bytewax)


def document_changes(doc: dict) -> list:
    """``(word, page_id, positions)`` per distinct word of a document, as the plain loop's
    ``document_words`` finds them.

    >>> document_changes({"page_id": 7, "text": "To be or not to be"})[:2]
    [('to', 7, [0, 4]), ('be', 7, [1, 5])]
    """
    page_id = doc["page_id"]
    return [(w, page_id, p) for w, p in word_positions(doc["text"]).items()]


def index_step(postings: Optional[dict], change: tuple) -> tuple:
    """``stateful_map``'s function: the word's posting list with the page added, and the
    change record as JSON. O(1)."""
    import orjson

    word, page_id, positions = change
    if postings is None:
        postings = {}
    postings[page_id] = positions
    record = {"op": "add", "word": word, "page_id": page_id, "positions": positions, "df": len(postings)}
    return postings, orjson.dumps(record).decode()


def flow(input_dir: str, output_dir: str, files: int = 2) -> Any:
    """The Dataflow (``python -m bytewax.run 'module:flow("in", "out")'``)."""
    import orjson
    import bytewax.operators as op
    from bytewax.connectors.files import DirSink, DirSource
    from bytewax.dataflow import Dataflow

    f = Dataflow("inverted_index")
    lines = op.input("documents", f, DirSource(Path(input_dir), glob_pat="*.json"))
    changes = op.flat_map("words", op.map("parse", lines, orjson.loads), document_changes)
    records = op.stateful_map("index", op.key_on("by_word", changes, lambda c: c[0]), index_step)
    op.output("changes", records, DirSink(Path(output_dir), files))
    return f


def run_workers(input_dir: Path, output_dir: Path, recovery_dir: Optional[Path], snapshot_interval: int,
                processes: int) -> int:
    """Start the worker processes (this process's group: the driver kills it whole) and wait;
    returns the first non-zero exit code, or 0."""
    args: list = []
    if recovery_dir is not None:
        recovery_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery_dir), str(processes)], check=True)
        # -b 0: no extra snapshots kept for backups of the recovery partitions
        args = ["-r", str(recovery_dir), "-s", str(snapshot_interval), "-b", "0"]
    output_dir.mkdir(parents=True, exist_ok=True)
    addresses = ";".join(f"127.0.0.1:{BASE_PORT + i}" for i in range(processes))
    target = f"{MODULE}:flow({str(input_dir)!r}, {str(output_dir)!r})"
    workers = [subprocess.Popen([sys.executable, "-m", "bytewax.run", target, "-i", str(i), "-a", addresses, *args])
               for i in range(processes)]
    codes = [w.wait() for w in workers]
    return next((c for c in codes if c), 0)


def files_flow(input_dir: str, output_dir: str, stamp: str) -> Any:
    """The files basis's Dataflow (:mod:`.files_basis`): the same steps over the two ``*.jsonl``
    files, one output file; the first ``next_batch`` of any file partition stamps ``stamp``."""
    import orjson
    import bytewax.operators as op
    from bytewax.connectors.files import DirSink, DirSource

    from bytewax.dataflow import Dataflow

    from .files_basis import stamp_first_read

    class Stamped(DirSource):
        def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
            part = super().build_part(step_id, for_part, resume_state)
            batch = part.next_batch

            def first_batch() -> Any:
                stamp_first_read(Path(stamp))
                part.next_batch = batch  # from now on the partition's own
                return batch()

            part.next_batch = first_batch
            return part

    f = Dataflow("inverted_index_files")
    lines = op.input("documents", f, Stamped(Path(input_dir), glob_pat="*.jsonl"))
    changes = op.flat_map("words", op.map("parse", lines, orjson.loads), document_changes)
    records = op.stateful_map("index", op.key_on("by_word", changes, lambda c: c[0]), index_step)
    op.output("changes", records, DirSink(Path(output_dir), 1))
    return f


def run_files_worker(input_dir: Path, output_dir: Path, stamp: Path, recovery_dir: Optional[Path],
                     snapshot_interval: int) -> None:
    """One worker in this process (``bytewax.run``'s own entry, without a second interpreter):
    recovery partitions and snapshots every ``snapshot_interval`` s where ``recovery_dir`` is given."""
    from datetime import timedelta

    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.run import cli_main

    output_dir.mkdir(parents=True, exist_ok=True)
    options: dict = {}
    if recovery_dir is not None:
        recovery_dir.mkdir(parents=True, exist_ok=True)
        init_db_dir(recovery_dir, 1)
        # backup_interval 0: no extra snapshots kept for backups of the recovery partitions
        options = {"epoch_interval": timedelta(seconds=snapshot_interval), "recovery_config": RecoveryConfig(recovery_dir, timedelta(0))}
    cli_main(files_flow(str(input_dir), str(output_dir), str(stamp)), workers_per_process=1, **options)


# ------------------------------------------------------------------ the driver's side (no bytewax needed)


def bytewax_python(python: Optional[str] = None) -> str:
    """The interpreter that runs the job (see :func:`.flink_job.interpreter_with`)."""
    from driftstream.examples.flink_job import interpreter_with

    return interpreter_with(
        "bytewax", python, BYTEWAX_PYTHON_ENV, BYTEWAX_VENV,
        "it is kept out of driftstream's install: python3 -m venv .venv-bytewax && "
        ".venv-bytewax/bin/pip install bytewax==0.21.1 orjson && .venv-bytewax/bin/pip install --no-deps -e .",
    )


class GrowingFiles:
    """The JSON lines appended to the files of a directory, as they appear (a line counts once
    it ends in a newline), kept as bytes (see :func:`.documents.page_of_line`).

    >>> import tempfile
    >>> from driftstream.examples.inverted_index.documents import page_of_line
    >>> d = Path(tempfile.mkdtemp())
    >>> out = GrowingFiles(d)
    >>> _ = (d / "part_0").write_text('{"page_id":1}\\n{"page_id"')
    >>> out.poll(), out.first_output is not None
    ([b'{"page_id":1}'], True)
    >>> with open(d / "part_0", "a") as f: _ = f.write(':22,"df":1}\\n')
    >>> [page_of_line(line) for line in out.poll()], out.poll()
    ([22], [])
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.offsets: dict = {}
        self.first_output: Optional[float] = None  # when the first line was seen

    def poll(self) -> list:
        """The lines completed since the last call."""
        try:
            entries = [e for e in os.scandir(self.directory) if e.is_file()]
        except FileNotFoundError:
            return []
        lines: list = []
        for e in entries:
            start = self.offsets.get(e.name, 0)
            with open(e.path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1
            if end:
                self.offsets[e.name] = start + end
                lines += [line for line in data[:end].split(b"\n") if line.strip()]
        if lines and self.first_output is None:
            self.first_output = time.time()
        return lines


def run_bytewax_backlog(docs: list, workdir: Path, *, processes: int = 2, snapshot_interval: Optional[int] = 1,
                        python: Optional[str] = None, timeout: Optional[float] = None) -> dict:
    """Run the job over ``docs`` already in files; returns the figures of
    :func:`.throughput.summary` (clock from the job's launch; a document is done when all its
    records are written) and the order-free check, plus ``completions`` (``(time, 1)`` per
    document). ``snapshot_interval``: whole seconds (``bytewax.run`` takes no less); None: no
    recovery (nothing snapshotted)."""
    from driftstream.examples.flink_job import FlinkJob

    from .document_files import write_documents
    from .flink_baseline import DocumentOutput

    python = bytewax_python(python)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    files = write_documents(docs, workdir / "input")  # the files Spark and Flink read
    out = DocumentOutput(GrowingFiles(workdir / "output"), docs)
    args = ["--input", str(workdir / "input"), "--output", str(workdir / "output"), "--processes", str(processes)]
    if snapshot_interval is not None:
        args += ["--recovery", str(workdir / "recovery"), "--snapshot-interval", str(snapshot_interval)]
    job = FlinkJob(python, workdir, MODULE, args)  # any job module with a "job" command: its own process group
    problems: list = []
    deadline = job.launched + (timeout if timeout is not None else 120 + len(docs) / 5)
    try:
        job.watch(out.poll, out.complete, deadline)
        if not out.complete():
            job.watch(out.poll, lambda: False, min(deadline, time.time() + 5))  # the job's own end, if it is near
        rc = job.proc.poll()
        if rc not in (0, None):
            problems.append(f"job failed ({rc}): {job.tail()}")
        elif not out.complete():
            problems.append(f"{len(out.visible)} of {len(docs)} documents done after {time.time() - job.launched:.0f} s")
    finally:
        job.stop()
    return out.backlog_figures(
        "bytewax", docs, job, problems, files=files, processes=processes, snapshot_interval=snapshot_interval
    )


def run_bytewax_files(docs: list, inputs: Sequence[Path], workdir: Path, *, snapshot_interval: Optional[int] = 1,
                      python: Optional[str] = None, timeout: Optional[float] = None) -> dict:
    """The files basis's row (:mod:`.files_basis`): one worker over ``inputs`` (the two files),
    timed from the process's launch and from its first read, output checked without order."""
    from .files_basis import STAMP, check_records, files_row, launch, read_stamp

    python = bytewax_python(python)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["files-job", "--input", str(Path(inputs[0]).parent), "--output", str(workdir / "output"), "--stamp", str(workdir / STAMP)]
    if snapshot_interval is not None:
        args += ["--recovery", str(workdir / "recovery"), "--snapshot-interval", str(snapshot_interval)]
    run = launch([python, "-m", MODULE, *args], "the Bytewax job", timeout if timeout is not None else 120 + len(docs) / 5)
    out = workdir / "output"
    lines = [line for p in sorted(out.iterdir()) for line in p.read_bytes().splitlines() if line.strip()] if out.exists() else []
    records = [json.loads(line) for line in lines]
    problems = run.problems + check_records(records, docs, None)
    name = "bytewax, 1 worker, " + (f"recovery every {snapshot_interval} s" if snapshot_interval is not None else "no recovery")
    return files_row(name, len(docs), len(records), run.launched, read_stamp(workdir / STAMP), run.ended, problems, cpu_s=run.cpu_s,
                     output="a line per change, in no fixed order of the two files (df checked as a multiset)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    job = sub.add_parser("job", help="run the worker processes (under an interpreter with bytewax)")
    job.add_argument("--input", required=True, type=Path)
    job.add_argument("--output", required=True, type=Path)
    job.add_argument("--recovery", type=Path, default=None, help="recovery partitions' directory (none: no snapshots)")
    job.add_argument("--snapshot-interval", type=int, default=1, help="whole seconds (bytewax.run takes no less)")
    job.add_argument("--processes", type=int, default=2)
    files = sub.add_parser("files-job", help="the files basis's one worker, in this process (files_basis.py)")
    files.add_argument("--input", required=True, type=Path)
    files.add_argument("--output", required=True, type=Path)
    files.add_argument("--stamp", required=True, type=Path)
    files.add_argument("--recovery", type=Path, default=None, help="recovery partitions' directory (none: no snapshots)")
    files.add_argument("--snapshot-interval", type=int, default=1, help="whole seconds")
    args = ap.parse_args(argv)
    if args.command == "files-job":
        run_files_worker(args.input, args.output, args.stamp, args.recovery, args.snapshot_interval)
        return 0
    return run_workers(args.input, args.output, args.recovery, args.snapshot_interval, args.processes)


if __name__ == "__main__":
    sys.exit(main())
