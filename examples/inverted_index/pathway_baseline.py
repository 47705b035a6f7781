"""The inverted index on Pathway: a peer with a Rust core (differential dataflow), on the files basis.

Same input and per-element work as :func:`.files_basis.index_files`: the two JSON-lines files
of :func:`.files_basis.write_files`, each document ``{"page_id", "text"}``; for each distinct
word of a document its positions (:func:`.documents.word_positions`, the example's tokenizer).

Job
---
A Python connector reads the two files alternately (so in the list's order), ``orjson.loads``
each line and commits after each document: each document is a time of its own, so the output
is a per-document changelog. ``select`` the ``(word, positions)`` pairs -> ``flatten`` ->
``groupby(word).reduce(df=count(), page_id=latest(page_id), positions=latest(positions))`` ->
``pw.io.jsonlines.write``. Two threads (``PATHWAY_THREADS=2``), no persistence.

The changelog's form differs from the other engines' records: at each document's time, for
each of its words, a row ``{"word", "df", "page_id", "positions", "diff": 1, "time"}`` (the
change record: ``df`` pages hold the word, the latest being this page) and, for a word seen
before, the retraction (``"diff": -1``) of the word's previous row. :func:`parse_changelog`
turns the insertions into change records ``{"op": "add", ...}`` and counts the retractions.

The driver (:func:`run_pathway_files`; no pathway needed) runs :func:`main`'s ``job`` under an
interpreter that has pathway (:func:`pathway_python`) and checks the output.

Install (kept out of the default install, as Flink and Bytewax)::

    python3 -m venv .venv-pathway          # in the checkout: found there, or set $DRIFTSTREAM_PATHWAY_PYTHON
    .venv-pathway/bin/pip install pathway orjson
    .venv-pathway/bin/pip install --no-deps -e .

>>> parse_changelog([b'{"word":"a","df":1,"page_id":7,"positions":[0],"diff":1,"time":2}',
...                  b'{"word":"a","df":1,"page_id":7,"positions":[0],"diff":-1,"time":4}',
...                  b'{"word":"a","df":2,"page_id":8,"positions":[1],"diff":1,"time":4}'])
([{'op': 'add', 'word': 'a', 'page_id': 7, 'positions': [0], 'df': 1}, {'op': 'add', 'word': 'a', 'page_id': 8, 'positions': [1], 'df': 2}], 1)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import orjson

PATHWAY_PYTHON_ENV = "DRIFTSTREAM_PATHWAY_PYTHON"
#: Where the setup above puts Pathway's interpreter: a venv of its own beside the checkout's.
PATHWAY_VENV = Path(__file__).resolve().parents[2] / ".venv-pathway"
MODULE = "driftstream.examples.inverted_index.pathway_baseline"
#: Pathway's worker threads.
THREADS = 2


# ------------------------------------------------------------------ the job's side (runs under pathway)


def alternate_lines(paths: Sequence[Path]) -> Any:
    """The lines of ``paths`` taken in turn, one of each while they last: the list's order of
    the documents :func:`.files_basis.write_files` alternated over them.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a").write_bytes(b"1\\n3\\n5\\n"); _ = (d / "b").write_bytes(b"2\\n4\\n")
    >>> list(alternate_lines([d / "a", d / "b"]))
    [b'1', b'2', b'3', b'4', b'5']
    """
    files = [open(p, "rb") for p in paths]
    try:
        while files:
            for f in list(files):
                line = f.readline()
                if not line:
                    files.remove(f)
                    f.close()
                elif line.strip():
                    yield line.rstrip(b"\n")
    finally:
        for f in files:
            f.close()


def word_pairs(text: str) -> list:
    """A document's ``(word, positions)`` pairs, in order of first occurrence.

    >>> word_pairs("a b a")
    [('a', [0, 2]), ('b', [1])]
    """
    from .documents import word_positions

    return list(word_positions(text).items())


def run_job(inputs: Sequence[Path], output: Path, stamp: Path) -> None:
    """Build the job (see the module doc) and run it to the end of the files."""
    import pathway as pw

    from .files_basis import stamp_first_read

    class Document(pw.Schema):
        page_id: int
        text: str

    class Documents(pw.io.python.ConnectorSubject):
        def run(self) -> None:
            stamp_first_read(stamp)
            for line in alternate_lines(inputs):
                doc = orjson.loads(line)
                self.next(page_id=doc["page_id"], text=doc["text"])
                self.commit()  # a time per document: the changelog has every df

    docs = pw.io.python.read(Documents(), schema=Document, autocommit_duration_ms=None)
    pairs = docs.select(docs.page_id, pair=pw.apply_with_type(word_pairs, list[tuple[str, list[int]]], docs.text))
    flat = pairs.flatten(pw.this.pair)
    words = flat.select(pw.this.page_id, word=pw.this.pair[0], positions=pw.this.pair[1])
    index = words.groupby(pw.this.word).reduce(
        pw.this.word, df=pw.reducers.count(), page_id=pw.reducers.latest(pw.this.page_id),
        positions=pw.reducers.latest(pw.this.positions),
    )
    pw.io.jsonlines.write(index, str(output))
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)


# ------------------------------------------------------------------ the driver's side (no pathway needed)


def pathway_python(python: Optional[str] = None) -> str:
    """The interpreter that runs the job (see :func:`.flink_job.interpreter_with`)."""
    from driftstream.examples.flink_job import interpreter_with

    return interpreter_with(
        "pathway", python, PATHWAY_PYTHON_ENV, PATHWAY_VENV,
        "it is kept out of driftstream's install: python3 -m venv .venv-pathway && "
        ".venv-pathway/bin/pip install pathway orjson && .venv-pathway/bin/pip install --no-deps -e .",
    )


def parse_changelog(lines: Sequence[bytes]) -> tuple:
    """The change records of the changelog's insertions, and the number of its retractions."""
    records, retractions = [], 0
    for line in lines:
        row = orjson.loads(line)
        if row["diff"] < 0:
            retractions += 1
            continue
        records.append({"op": "add", "word": row["word"], "page_id": row["page_id"], "positions": row["positions"], "df": row["df"]})
    return records, retractions


def run_pathway_files(docs: Sequence[dict], inputs: Sequence[Path], workdir: Path, *, python: Optional[str] = None,
                      threads: int = THREADS, timeout: Optional[float] = None) -> dict:
    """The files basis's row (:mod:`.files_basis`): the job over ``inputs``, timed from its
    process's launch and from its first read; the insertions checked in the list's order."""
    from .files_basis import STAMP, check_records, file_order, files_row, launch, read_stamp

    python = pathway_python(python)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    output, stamp = workdir / "changelog.jsonl", workdir / STAMP
    cmd = [python, "-m", MODULE, "job", "--output", str(output), "--stamp", str(stamp), *map(str, inputs)]
    env = {**os.environ, "PATHWAY_THREADS": str(threads)}
    run = launch(cmd, "the Pathway job", timeout if timeout is not None else 120 + len(docs) / 5, env=env)
    lines = [line for line in output.read_bytes().splitlines() if line.strip()] if output.exists() else []
    records, retractions = parse_changelog(lines)
    problems = run.problems + check_records(records, docs, file_order(docs, "pathway"))
    return files_row(f"pathway, {threads} threads", len(docs), len(records), run.launched, read_stamp(stamp), run.ended, problems,
                     cpu_s=run.cpu_s,
                     retractions=retractions,
                     output=f"a changelog row per (word, document) insertion, the records counted here, plus {retractions:,} "
                            "retractions of a word's previous row")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    job = sub.add_parser("job", help="run the job (under an interpreter with pathway)")
    job.add_argument("inputs", nargs="+", type=Path)
    job.add_argument("--output", required=True, type=Path)
    job.add_argument("--stamp", required=True, type=Path)
    args = ap.parse_args(argv)
    run_job(args.inputs, args.output, args.stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
