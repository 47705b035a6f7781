"""The files basis of the throughput benchmark: every engine reads the same two JSON-lines files
and writes JSON lines to files, no broker (so no broker's or measuring consumer's CPU counts).

    driftstream bench inverted-index --throughput --basis files --docs 10000

Input: the documents alternated between two files (``docs-0.jsonl`` holds the 1st, 3rd, ...),
``{"page_id", "text"}`` per line (:func:`write_files`). Output: one change record per line.
The rows, one after the other in one invocation:

- **the plain loop**: one Python thread reads file 0 then file 1, ``orjson.loads``,
  :func:`~.pipeline.document_words`, each word's posting list through
  :func:`~.pipeline.index_update`, one orjson line per change to a file, fsync at the end
  (:func:`index_files`; run as ``python -m`` this module, so its launch counts as the others').
- **driftstream**: ``pipeline.build(FileSource(2 files), FileSink)`` with a FileSink for dead
  letters, exactly-once, 1 s snapshots, parallelism 2 and 1, on a Ray session already up.
- **Bytewax** 0.21.1, one worker, recovery every 1 s and none (:mod:`.bytewax_baseline`).
- **Pathway**, two threads, a per-document changelog (:mod:`.pathway_baseline`).

Clocks: *from launch* starts when the driver launches the engine (a process for the loop,
Bytewax and Pathway; ``flow.run`` for driftstream, whose Ray session is already up);
*from first read* starts when the engine first reads an input file (each engine stamps
that time into a file, :func:`stamp_first_read`). Both end when the run is over (the
process exited, ``flow.run`` returned): the output is then complete and durable.

Every engine's output is checked the same way (:func:`check_records`): the order-free check
(each ``(word, page, positions)`` once, each word's ``df`` values 1..n) and
:func:`.ground_truth.check` against the sequential reference, with ``df`` in order where the
engine's order of the documents is fixed (:func:`file_order`: driftstream merges the files
by byte offset; the loop reads file 0 then file 1; Pathway's reader alternates them), as a
multiset without ``df`` where it is not (Bytewax).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import orjson

#: Input files, the documents alternated between them.
FILES = 2
MODULE = "driftstream.examples.inverted_index.files_basis"
#: The file each engine stamps with the time of its first input read.
STAMP = "first-read"


# ------------------------------------------------------------------ input, stamps, the loop (no engine needed)


def write_files(docs: Sequence[dict], directory: Path, files: int = FILES) -> list:
    """Write ``docs`` alternated over ``files`` JSON-lines files; returns their paths.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> paths = write_files([{"page_id": i, "text": "a"} for i in range(3)], d)
    >>> [p.name for p in paths], paths[1].read_text()
    (['docs-0.jsonl', 'docs-1.jsonl'], '{"page_id":1,"text":"a"}\\n')
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"docs-{i}.jsonl" for i in range(files)]
    for i, path in enumerate(paths):
        path.write_bytes(b"".join(orjson.dumps({"page_id": d["page_id"], "text": d["text"]}) + b"\n" for d in docs[i::files]))
    return paths


def file_order(docs: Sequence[dict], engine: str, files: int = FILES) -> Optional[list]:
    """The order in which ``engine`` applies ``docs`` written by :func:`write_files`, or None
    where it is not fixed. driftstream's FileSource times a line by its byte offset and
    merges the files by (offset, file); the loop reads the files one after the other;
    Pathway's reader alternates them, as the list is.

    >>> docs = [{"page_id": 1, "text": "long text here"}, {"page_id": 2, "text": "a"},
    ...         {"page_id": 3, "text": "b"}, {"page_id": 4, "text": "c"}]
    >>> [d["page_id"] for d in file_order(docs, "driftstream")]   # page 4 starts before page 3's offset
    [1, 2, 4, 3]
    >>> [d["page_id"] for d in file_order(docs, "loop")], file_order(docs, "bytewax")
    ([1, 3, 2, 4], None)
    """
    if engine == "loop":
        return [d for i in range(files) for d in docs[i::files]]
    if engine == "pathway":
        return list(docs)
    if engine != "driftstream":
        return None
    keyed = []
    for i in range(files):
        offset = 0
        for d in docs[i::files]:
            keyed.append((offset, i, d))
            offset += len(orjson.dumps({"page_id": d["page_id"], "text": d["text"]})) + 1
    return [d for _, _, d in sorted(keyed, key=lambda k: (k[0], k[1]))]


def stamp_first_read(path: Path) -> None:
    """Write the time now into ``path`` unless it exists: the first reader of a run wins."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(repr(time.time()))


def read_stamp(path: Path) -> Optional[float]:
    """The time :func:`stamp_first_read` wrote, or None (no read was stamped)."""
    try:
        return float(Path(path).read_text())
    except (OSError, ValueError):
        return None


def index_files(inputs: Sequence[Path], output: Path, stamp: Optional[Path] = None) -> int:
    """The plain loop over the files (see the module doc); returns the change records written.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> paths = write_files([{"page_id": 1, "text": "a b a"}, {"page_id": 2, "text": "b"}], d)
    >>> index_files(paths, d / "out.jsonl"), (d / "out.jsonl").read_text().splitlines()[-1]
    (3, '{"op":"add","word":"b","page_id":2,"positions":[0],"df":2}')
    """
    from .pipeline import document_words, index_update
    from .throughput import _Postings

    index: dict = {}
    records = 0
    with open(output, "wb") as out:
        for path in inputs:
            with open(path, "rb") as f:
                if stamp is not None:
                    stamp_first_read(stamp)  # the first file's open wins; later ones find the stamp
                for line in f:
                    for change in document_words(orjson.loads(line)):
                        postings = index.get(change[1])
                        if postings is None:
                            postings = index[change[1]] = _Postings()
                        for record in index_update(postings, change):
                            out.write(orjson.dumps(record) + b"\n")
                            records += 1
        out.flush()
        os.fsync(out.fileno())
    return records


# ------------------------------------------------------------------ rows, checks and the table (pure)


def check_records(records: Sequence[dict], docs: Sequence[dict], order: Optional[Sequence[dict]]) -> list:
    """The problems of an engine's change records (none: correct): the order-free check, and
    the sequential reference's records per word, ``df`` included where ``order`` (the
    engine's order of the documents) is known.

    >>> docs = [{"page_id": 1, "text": "a b"}, {"page_id": 2, "text": "b"}]
    >>> from .ground_truth import reference_changes
    >>> check_records(reference_changes(docs), docs, docs), check_records(reference_changes(docs[::-1]), docs, None)
    ([], [])
    >>> check_records(reference_changes(docs[::-1]), docs, docs)[0]
    "word 'b': 2 records, expected 2; first difference at #0: got page 2: add b [0] df=1, expected page 1: add b [1] df=1"
    """
    from .flink_baseline import check_changes
    from .ground_truth import GroundTruth, check, reference_changes, reference_index

    truth = GroundTruth(index=reference_index(docs), changes=reference_changes(order if order is not None else docs))
    return check(list(records), truth, compare_df=order is not None) + check_changes(records, docs)


def files_row(engine: str, docs: int, records: int, launched: float, first_read: Optional[float], ended: float,
              problems: list, cpu_s: Optional[float] = None, **extra: Any) -> dict:
    """One engine's figures: docs/s and seconds from its launch and from its first read, and
    its CPU seconds (all its processes) and µs of CPU per change record.

    >>> r = files_row("x", 100, 500, 10.0, 12.0, 14.0, [], cpu_s=1.0)
    >>> r["seconds_from_launch"], r["docs_per_s"], r["seconds_from_first_read"], r["docs_per_s_from_first_read"], r["correct"]
    (4.0, 25.0, 2.0, 50.0, True)
    >>> r["cpu_s"], r["cpu_us_per_record"]
    (1.0, 2000.0)
    """
    from_launch = max(ended - launched, 1e-9)
    from_read = max(ended - first_read, 1e-9) if first_read is not None else None
    return {
        "engine": engine,
        "docs": docs,
        "records": records,
        "seconds_from_launch": round(from_launch, 2),
        "docs_per_s": round(docs / from_launch, 1),
        "seconds_from_first_read": round(from_read, 2) if from_read is not None else None,
        "docs_per_s_from_first_read": round(docs / from_read, 1) if from_read is not None else None,
        "cpu_s": cpu_s,
        "cpu_us_per_record": round(cpu_s / records * 1e6, 2) if cpu_s is not None and records else None,
        "correct": not problems,
        "problems": problems[:10],
        **extra,
    }


def with_ratios(rows: list, loop_engine: str = "plain loop") -> list:
    """Each row with its docs/s over the plain loop's, from launch and from first read.

    >>> rows = with_ratios([files_row("plain loop", 10, 1, 0, 1, 2, []), files_row("x", 10, 1, 0, 2, 4, [])])
    >>> rows[1]["of_loop"], rows[1]["of_loop_from_first_read"]
    (0.5, 0.5)
    """
    loop = next((r for r in rows if r["engine"] == loop_engine), None)
    for r in rows:
        if loop is None:
            r["of_loop"] = r["of_loop_from_first_read"] = r["of_loop_by_cpu"] = None
            continue
        r["of_loop"] = round(r["docs_per_s"] / loop["docs_per_s"], 3)
        a, b = r.get("docs_per_s_from_first_read"), loop.get("docs_per_s_from_first_read")
        r["of_loop_from_first_read"] = round(a / b, 3) if a and b else None
        # CPU per record, the loop's over the engine's: the share of a machine's cores' work that is the flow's own
        a, b = r.get("cpu_us_per_record"), loop.get("cpu_us_per_record")
        r["of_loop_by_cpu"] = round(b / a, 3) if a and b else None
    return rows


def floors(rows: Sequence[dict]) -> list:
    """Issue 57's floors on the files basis, from the rows of one invocation: driftstream at
    parallelism 2 at least Bytewax's one worker with 1 s recovery, and at parallelism 1 at
    least half the plain loop; docs/s from launch and by CPU per record. A floor whose rows
    did not run (or came out wrong) is left out.

    >>> rows = with_ratios([files_row("plain loop", 100, 10, 0.0, 0.0, 1.0, [], cpu_s=1.0),
    ...                     files_row("driftstream, parallelism 2", 100, 10, 0.0, 0.0, 4.0, [], cpu_s=4.0),
    ...                     files_row("driftstream, parallelism 1", 100, 10, 0.0, 0.0, 2.0, [], cpu_s=2.0),
    ...                     files_row("bytewax, 1 worker, recovery every 1 s", 100, 10, 0.0, 0.0, 5.0, [], cpu_s=5.0)])
    >>> [(f["floor"][:40], f["ratio"], f["met"], f["ratio_by_cpu"]) for f in floors(rows)]
    [('driftstream, parallelism 2 >= bytewax, 1', 1.25, True, 1.25), ('driftstream, parallelism 1 >= 0.5 of the', 1.0, True, 1.0)]
    """
    by = {r["engine"]: r for r in rows if r.get("correct")}
    out = []
    for engine, against, share in (("driftstream, parallelism 2", "bytewax, 1 worker, recovery every 1 s", 1.0),
                                   ("driftstream, parallelism 1", "plain loop", 0.5)):
        if engine not in by or against not in by:
            continue
        a, b = by[engine], by[against]
        ratio = round(a["docs_per_s"] / (share * b["docs_per_s"]), 3)
        # by CPU: the other's µs per record over this one's, against the same share
        ca, cb = a.get("cpu_us_per_record"), b.get("cpu_us_per_record")
        cpu = round(cb / (share * ca), 3) if ca and cb else None
        out.append({"floor": f"{engine} >= {'' if share == 1 else f'{share} of the '}{against}", "ratio": ratio,
                    "met": ratio >= 1.0, "ratio_by_cpu": cpu})
    return out


def files_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table.

    >>> print(files_table(with_ratios([files_row("plain loop", 10, 5, 0.0, 1.0, 2.0, [], cpu_s=0.5, output="a line per change")])))
    | engine | docs/s | records | from launch, s | from first read, s | docs/s from first read | of the loop (from launch / first read) | CPU s | CPU µs/record | of the loop by CPU | correct | output |
    |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|
    | plain loop | 5.0 | 5 | 2.0 | 1.0 | 10.0 | 1.0 / 1.0 | 0.5 | 100000.0 | 1.0 | yes | a line per change |
    """
    lines = ["| engine | docs/s | records | from launch, s | from first read, s | docs/s from first read | "
             "of the loop (from launch / first read) | CPU s | CPU µs/record | of the loop by CPU | correct | output |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['docs_per_s']:,} | {r['records']:,} | {r['seconds_from_launch']} | "
                     f"{r.get('seconds_from_first_read')} | {r.get('docs_per_s_from_first_read')} | "
                     f"{r.get('of_loop')} / {r.get('of_loop_from_first_read')} | {r.get('cpu_s')} | {r.get('cpu_us_per_record')} | "
                     f"{r.get('of_loop_by_cpu')} | {'yes' if r['correct'] else 'NO'} | {r.get('output', '')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the runs (the driver's side)


def _lines(paths: Sequence[Path]) -> list:
    return [line for p in paths for line in Path(p).read_bytes().splitlines() if line.strip()]


@dataclass
class Launch:
    """A job process's run: when it was launched and ended, its CPU (its process tree's, from
    the kernel's account of waited-for children) and what went wrong (empty: nothing)."""

    launched: float
    ended: float
    cpu_s: float
    problems: list


def launch(cmd: Sequence[str], what: str, timeout: float, env: Optional[dict] = None) -> Launch:
    """Run ``cmd`` to its end (or ``timeout`` s); ``what`` names it in a problem."""
    import resource
    import subprocess

    def children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before, launched = children(), time.time()
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
        problems = [] if done.returncode == 0 else [f"{what} failed ({done.returncode}): {done.stderr[-2000:]}"]
    except subprocess.TimeoutExpired:
        problems = [f"{what} did not end within {timeout:.0f} s"]
    return Launch(launched, time.time(), round(children() - before, 2), problems)


class TreeCpu:
    """CPU seconds of this process's descendants (a Ray session it started: raylet, actors)
    over a run, from Linux's /proc sampled every ``every`` s (a process that exits between
    two samples loses its last moments: a lower bound); py-spy's processes are left out."""

    def __init__(self, every: float = 0.25) -> None:
        import threading

        self.every, self.root = every, os.getpid()
        self.base = self._sample()
        self.last = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> dict:
        from driftstream.examples.benchmarks.flames import _descends

        tick, out = os.sysconf("SC_CLK_TCK"), {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            pid = int(entry)
            try:
                if b"py-spy" in Path(f"/proc/{pid}/cmdline").read_bytes() or not _descends(pid, self.root):
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (after pid, comm)
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.last.update(self._sample())

    def stop(self) -> float:
        """Stop sampling; the CPU seconds used since the start."""
        self._stop.set()
        self._thread.join()
        self.last.update(self._sample())
        return round(sum(cpu - self.base.get(pid, 0.0) for pid, cpu in self.last.items()), 2)


def run_loop(docs: Sequence[dict], inputs: Sequence[Path], workdir: Path, python: str = sys.executable) -> dict:
    """The plain loop as a process of its own (``python -m`` this module ``loop``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out, stamp = workdir / "loop.jsonl", workdir / STAMP
    stamp.unlink(missing_ok=True)  # a loop run before in this invocation left its own (the first read's stamp wins)
    run = launch([python, "-m", MODULE, "loop", "--output", str(out), "--stamp", str(stamp), *map(str, inputs)],
                 "the loop", timeout=60 + len(docs) / 50)
    records = [orjson.loads(line) for line in _lines([out])] if out.exists() else []
    problems = run.problems + check_records(records, docs, file_order(docs, "loop"))
    return files_row("plain loop", len(docs), len(records), run.launched, read_stamp(stamp), run.ended, problems,
                     cpu_s=run.cpu_s, output="a line per change (the reference's records)")


def _stamped_source(inputs: Sequence[Path], stamp: Path) -> Any:
    """A FileSource over ``inputs`` that stamps its first read (in the stage actor) into ``stamp``."""
    from .stamped_file_source import StampedFileSource

    return StampedFileSource([str(p) for p in inputs], stamp=str(stamp))


def run_driftstream(docs: Sequence[dict], inputs: Sequence[Path], workdir: Path, parallelism: int,
                    snapshot_interval: float = 1.0, profile: Optional[Path] = None, warm: bool = False) -> dict:
    """The index flow from the files to a FileSink, exactly-once, on the Ray session that is up.
    ``profile``: a directory for py-spy's raw stacks of each of the run's actors (:func:`step_kind_costs`);
    ``warm``: its stage actors and acker started before the clock starts (:func:`~driftstream.engine.warm_up`)."""
    from driftstream.engine.connectors.file_sink import FileSink, read_file_sink

    from .pipeline import build

    tag = f"p{parallelism}-{int(time.time() * 1000) % 10**8}"
    run_dir = workdir / f"driftstream-{tag}"
    run_dir.mkdir(parents=True, exist_ok=True)
    flow = build(_stamped_source(inputs, run_dir / STAMP), FileSink(str(run_dir / "out"), name="changes"), name=f"files-{tag}")
    flow.dead_letters(FileSink(str(run_dir / "dead-letters"), name="dead_letters"))
    recorders = None
    from driftstream.engine.control.warm_actors import fresh_pool

    with fresh_pool(flow.plan(parallelism) if warm else None):  # new processes, or warm ones, as the row says
        if profile is not None:
            from driftstream.examples.benchmarks.flames import Flames

            # After the warm actors' start, as the clock: their imports are not the run's (the
            # shares are scaled to the run's CPU, and counted they made a third of p2's profile).
            # The Ray session this process started (not another's): its processes descend from this one.
            recorders = Flames(profile, match="ray::", rate=PROFILE_RATE, fmt="raw", within=os.getpid())
            recorders.attach(label=f"{tag}-")  # the warm actors, from the clock's start
            recorders.follow(label=f"{tag}-", every=0.2)  # and any process the run starts
        cpu = TreeCpu()  # after the warm actors' start: the row's clock and CPU are the flow's
        launched = time.time()
        try:
            result = flow.run(parallelism=parallelism, guarantee="exactly-once", snapshot_interval=snapshot_interval,
                              snapshot_dir=str(run_dir / "snapshots"))
        finally:
            ended = time.time()
            cpu_s = cpu.stop()
            if recorders is not None:
                recorders.stop()
    records = [value for _, value in read_file_sink(str(run_dir / "out"), "changes")]
    dead = read_file_sink(str(run_dir / "dead-letters"), "dead_letters") if (run_dir / "dead-letters").exists() else []
    problems = [f"{len(dead)} dead letter(s)"] if dead else []
    problems += check_records(records, docs, file_order(docs, "driftstream"))
    return files_row(f"driftstream, parallelism {parallelism}{', warm actors' if warm else ''}", len(docs), len(records), launched, read_stamp(run_dir / STAMP),
                     ended, problems, cpu_s=cpu_s, snapshots=result.metrics.snapshots, parallelism=parallelism,
                     **({"profile_tag": tag} if profile is not None else {}),
                     output="a line per change, {t, value} (the reference's records as values)")


#: py-spy's samples per second in a profiled run.
PROFILE_RATE = 200

#: Leaf frames of a thread that waits (py-spy counts a wait in C as a sample): not CPU. The sink
#: writer's write and fsync are the disk's (the kernel's CPU in them is in the row's CPU seconds,
#: shared out over the rest): counted, they made the sink a fifth of p1's profile, of which perf saw
#: a tenth on the CPU.
IDLE_LEAVES = ("Worker.main_loop ", "EpollSelector.select ", "select (selectors", "Condition.wait ", "Event.wait ",
               "_wait_for_tstate_lock ", "Queue.get ", "_worker (concurrent/futures/thread.py", "BaseEventLoop._run_once (asyncio",
               "_append_durably (")

#: Kinds by the module of the frame nearest the leaf that is the engine's or the user's (first
#: match wins; a frame in no listed module, e.g. the standard library's, counts for its caller).
KIND_OF_MODULE = (
    ("examples/inverted_index/", "the user's functions (document_words, index_update, the key)"),
    ("engine/connectors/file_source.py", "source: FileSource read, JSON decode"),
    ("engine/runtime/source_pump.py", "source: FileSource read, JSON decode"),
    ("engine/connectors/file_sink.py", "sink: JSON encode, write, fsync (FileSink)"),
    ("barriers/json_payloads.py", "sink: JSON encode, write, fsync (FileSink)"),
    ("engine/runtime/sink_writers.py", "sink: JSON encode, write, fsync (FileSink)"),
    ("barriers/", "barrier: release into the sink"),
    ("engine/runtime/sink_release.py", "barrier: release into the sink"),
    ("ordering/keyed_state.py", "keyed state: apply, repair, fold (drifting logs, state cache)"),
    ("ordering/entry_state.py", "keyed state: apply, repair, fold (drifting logs, state cache)"),
    ("snapshots/", "keyed state: apply, repair, fold (drifting logs, state cache)"),
    ("engine/runtime/outbound.py", "routing (key_by, key groups)"),
    ("ordering/key_groups.py", "routing (key_by, key groups)"),
    ("ordering/partitioning.py", "routing (key_by, key groups)"),
    ("engine/runtime/operators.py", "operators' loops"),
    ("engine/runtime/transport.py", "data plane: frames (pickle, socket)"),
    ("engine/runtime/protocol.py", "data plane: frames (pickle, socket)"),
    ("ordering/input_merge.py", "input merge (ordering the inputs)"),
    ("ordering/sorted_queue.py", "input merge (ordering the inputs)"),
    ("ordering/acker.py", "acks (acker, ack table)"),
    ("ordering/ack_table.py", "acks (acker, ack table)"),
    ("engine/runtime/acker_host.py", "acks (acker, ack table)"),
    ("engine/runtime/latency_samples.py", "metrics, latency samples"),
    ("engine/", "the rest of the engine (stage, host, coordinator)"),
    ("ordering/", "the rest of the engine (stage, host, coordinator)"),
)

#: Kinds that any frame of the stack decides, before the leaf's module: what runs inside them
#: (a backend's put while a snapshot writes, an import) is theirs.
KIND_OF_CALLER = (
    ("<frozen importlib", "start-up: imports, actors' and state's set-up"),
    ("StageActor.__init__ ", "start-up: imports, actors' and state's set-up"),
    ("InstanceHost.setup ", "start-up: imports, actors' and state's set-up"),
    ("engine/runtime/stage_snapshots.py", "snapshots: taking and writing deltas"),
    ("snapshots/store.py", "snapshots: taking and writing deltas"),
    ("snapshots/snapshot_files.py", "snapshots: taking and writing deltas"),
    ("Keyed.settle ", "watermark: fold state below it (advance)"),
    ("DriftingLogs.advance ", "watermark: fold state below it (advance)"),
)

#: The kind of a sample in no engine or user module: Ray's core worker, asyncio's loop.
OUTSIDE = "Ray and asyncio (no driftstream frame)"


def step_kind(frames: Sequence[str]) -> Optional[str]:
    """The step kind of one sampled stack (py-spy's frames, root first), None for a wait.

    >>> step_kind(["run (x.py:1)", "FlatMap.run (engine/runtime/operators.py:183)", "tokenize (examples/inverted_index/documents.py:37)"])
    "the user's functions (document_words, index_update, the key)"
    >>> step_kind(["Keyed.settle (engine/runtime/operators.py:270)", "StateCache.put_many (snapshots/state_cache.py:161)"])
    'watermark: fold state below it (advance)'
    >>> step_kind(["_read_frames (engine/runtime/transport.py:170)", "loads (pickle.py:1)"])
    'data plane: frames (pickle, socket)'
    >>> step_kind(["main (ray/_private/worker.py:1)", "Worker.main_loop (ray/_private/worker.py:1069)"]) is None
    True
    >>> step_kind(["FileSinkPartition.write (engine/connectors/file_sink.py:233)", "_append_durably (engine/connectors/file_sink.py:140)"]) is None
    True
    """
    if not frames or frames[-1].startswith(IDLE_LEAVES):
        return None
    for pattern, kind in KIND_OF_CALLER:
        if any(pattern in f for f in frames):
            return kind
    for frame in reversed(frames):
        for pattern, kind in KIND_OF_MODULE:
            if pattern in frame:
                return kind
    return OUTSIDE


def stack_counts(path: Path) -> Any:
    """``(frames, samples)`` per line of a py-spy raw file (``frame;frame;... count``)."""
    for line in Path(path).read_text(errors="replace").splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def step_kind_costs(profile: Path, rows: Sequence[dict], rate: int = PROFILE_RATE) -> list:
    """Per profiled driftstream row, each step kind's share of py-spy's samples of the run's
    processes (waits left out, :data:`IDLE_LEAVES`) and its µs of CPU per change record: the
    share of the row's CPU per record (the kernel's account, ``cpu_us_per_record``). Samples
    alone would overstate it on a loaded machine: a thread waiting for a core is sampled as
    running. ``sampled_s``: the samples over ``rate``, for comparison.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "p1-1-StageActor-9.txt").write_text("a (engine/runtime/outbound.py:1) 3\\nb (engine/connectors/file_sink.py:2) 1\\n")
    >>> [(k["kind"][:7], k["share"], k["us_per_record"]) for k in step_kind_costs(d, [{"engine": "p1", "records": 4,
    ...     "cpu_us_per_record": 20.0, "profile_tag": "p1-1"}], rate=1)[0]["kinds"]]
    [('routing', 0.75, 15.0), ('sink: J', 0.25, 5.0)]
    """
    out = []
    for r in rows:
        tag = r.get("profile_tag")
        if not tag:
            continue
        samples: dict = {}
        for path in sorted(Path(profile).glob(f"{tag}-*.txt")):
            for frames, n in stack_counts(path):
                kind = step_kind(frames)
                if kind is not None:
                    samples[kind] = samples.get(kind, 0) + n
        total = sum(samples.values()) or 1
        per_record = r.get("cpu_us_per_record") or total / rate / max(r["records"], 1) * 1e6
        kinds = [{"kind": k, "share": round(n / total, 3), "us_per_record": round(n / total * per_record, 2),
                  "sampled_s": round(n / rate, 2)} for k, n in sorted(samples.items(), key=lambda kv: -kv[1])]
        out.append({"engine": r["engine"], "records": r["records"], "cpu_s": r.get("cpu_s"), "us_per_record": per_record,
                    "sampled_s": round(total / rate, 2), "kinds": kinds})
    return out


def step_kind_table(costs: Sequence[dict]) -> str:
    """µs of CPU per change record per step kind, a column per profiled run.

    >>> print(step_kind_table([{"engine": "a", "records": 10, "cpu_s": 1.0, "us_per_record": 1e5,
    ...                         "kinds": [{"kind": "x", "us_per_record": 1e5, "share": 1.0}]}]))
    | step kind | a, µs/record (share) |
    |---|---:|
    | x | 100000.0 (100%) |
    | all (CPU s) | 100000.0 (1.0 s) |
    """
    kinds: list = []
    for c in costs:
        kinds += [k["kind"] for k in c["kinds"] if k["kind"] not in kinds]
    lines = ["| step kind | " + " | ".join(f"{c['engine']}, µs/record (share)" for c in costs) + " |",
             "|---|" + "---:|" * len(costs)]
    for kind in kinds:
        cells = []
        for c in costs:
            k = next((k for k in c["kinds"] if k["kind"] == kind), None)
            cells.append(f"{k['us_per_record']} ({k['share']:.0%})" if k else "-")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| all (CPU s) | " + " | ".join(f"{c['us_per_record']} ({c['cpu_s']} s)" for c in costs) + " |")
    return "\n".join(lines)


def run_all_files(docs: Sequence[dict], engines: Sequence[str], workdir: Path, pythons: Optional[dict] = None,
                  report: Callable[[dict], None] = lambda r: None, profile: Optional[Path] = None) -> list:
    """Each engine of ``engines`` in turn over the same files (see :data:`FILES_ENGINES`)."""
    from .bytewax_baseline import run_bytewax_files
    from .pathway_baseline import run_pathway_files

    pythons = pythons or {}
    inputs = write_files(docs, workdir / "input")
    runs = {
        "loop": lambda: run_loop(docs, inputs, workdir / "loop"),
        "driftstream": lambda: run_driftstream(docs, inputs, workdir, 2, profile=profile),
        "driftstream-p1": lambda: run_driftstream(docs, inputs, workdir, 1, profile=profile),
        "driftstream-warm": lambda: run_driftstream(docs, inputs, workdir, 2, profile=profile, warm=True),
        "driftstream-p1-warm": lambda: run_driftstream(docs, inputs, workdir, 1, profile=profile, warm=True),
        "bytewax": lambda: run_bytewax_files(docs, inputs, workdir / "bytewax-recovery", snapshot_interval=1,
                                             python=pythons.get("bytewax")),
        "bytewax-no-recovery": lambda: run_bytewax_files(docs, inputs, workdir / "bytewax-none", snapshot_interval=None,
                                                         python=pythons.get("bytewax")),
        "pathway": lambda: run_pathway_files(docs, inputs, workdir / "pathway", python=pythons.get("pathway")),
    }
    from .throughput import run_engines

    return with_ratios(run_engines(runs, engines, report, "of the files basis "))


#: The engines of the files basis, in their default order.
FILES_ENGINES = ("loop", "driftstream", "driftstream-p1", "bytewax", "bytewax-no-recovery", "pathway")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m`` this module ``loop``: the plain loop as a process of its own."""
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    loop = sub.add_parser("loop", help="the plain loop over the input files")
    loop.add_argument("inputs", nargs="+", type=Path)
    loop.add_argument("--output", required=True, type=Path)
    loop.add_argument("--stamp", type=Path, default=None)
    args = ap.parse_args(argv)
    index_files(args.inputs, args.output, args.stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
