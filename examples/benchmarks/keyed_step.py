"""The inverted index's keyed step alone: what ``Keyed.run`` (landing, the function, the
outputs) and ``Keyed.settle`` (the fold below the watermark) cost per change record, in one
process, with the state a run has (entries in a StateCache over RocksDB).

    python -m driftstream.examples.benchmarks.keyed_step                 # 4,000 documents, two files
    python -m driftstream.examples.benchmarks.keyed_step --files 1 --python

The documents arrive as the files basis reads them: ``--files`` JSON-lines files (the
documents alternated between them), a line's t its byte offset in its file, 256 lines a read
from the file furthest behind, the watermark the least t of the last 2,000 lines read (a
run's ``max_inflight``). Two files read in turns make a quarter of the elements late (their
key's log holds a later one from the other file); one file, none. "function" is
``index_update`` over plain dicts in a loop: what is left is what the keyed step adds.

Times are the thread's CPU time with the cyclic collector off while timed: a young
collection's cost lands wherever it triggers, and made two runs of the same code differ by
a fifth on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from typing import Optional

#: lines a read, and lines in flight before the watermark passes them (a Ray run's defaults)
READ, IN_FLIGHT = 256, 2_000


def arrivals(docs: list, files: int) -> list:
    """``(items, watermark)`` per read: the index's ``(meta, change, word)`` items."""
    import orjson

    from driftstream.examples.inverted_index.pipeline import document_words

    parts = []
    for p in range(files):
        offset, rows = 0, []
        for d in docs[p::files]:
            rows.append((offset, d))
            offset += len(orjson.dumps({"page_id": d["page_id"], "text": d["text"]})) + 1
        parts.append(rows)
    pos, last, in_flight, reads = [0] * files, [-1] * files, [], []
    while any(pos[p] < len(parts[p]) for p in range(files)):
        p = min((q for q in range(files) if pos[q] < len(parts[q])), key=lambda q: (last[q], q))
        lines = parts[p][pos[p]:pos[p] + READ]
        pos[p] += len(lines)
        last[p] = lines[-1][0]
        items = [((off, 0, p, off, (k,), False), change, change[1])
                 for off, d in lines for k, change in enumerate(document_words(d))]
        in_flight = sorted(in_flight + [(off, 0, p, off) for off, _ in lines])[-IN_FLIGHT:]
        reads.append((items, in_flight[0]))
    return reads


def measure(reads: list, python: bool) -> dict:
    """Seconds of CPU in ``run`` and ``settle`` over all reads, outputs and late elements."""
    from driftstream.engine.runtime.operators import Keyed
    from driftstream.examples.inverted_index.pipeline import index_update
    from driftstream.ordering.entry_state import EntryKeyedState
    from driftstream.snapshots.backend import RocksDBBackend
    from driftstream.snapshots.entry_cache import CachedEntries
    from driftstream.snapshots.state_cache import StateCache

    backend = CachedEntries(StateCache(RocksDBBackend(tempfile.mkdtemp(prefix="keyed-step-") + "/db")))
    state = EntryKeyedState(index_update, flat=True, backend=backend)
    if python:
        state._path = None  # this instance runs the reference
    step = Keyed("index", state)
    run_s = settle_s = 0.0
    outputs = 0
    gc.disable()
    try:
        for items, watermark in reads:
            a = time.thread_time()
            outputs += len(step.run(list(items)))
            b = time.thread_time()
            step.settle(watermark)
            settle_s += time.thread_time() - b
            run_s += b - a
        b = time.thread_time()
        step.settle((float("inf"),))  # what was still in flight at the end folds too
        settle_s += time.thread_time() - b
    finally:
        gc.enable()
        backend.cache.close()
    return {"run": run_s, "settle": settle_s, "outputs": outputs, "late": state.out_of_order}


def function_only(reads: list) -> float:
    """CPU seconds of ``index_update`` over every item, posting lists in plain dicts."""
    from driftstream.examples.inverted_index.pipeline import index_update
    from driftstream.examples.inverted_index.throughput import _Postings

    index: dict = {}
    gc.disable()
    try:
        a = time.thread_time()
        for items, _ in reads:
            for _, change, word in items:
                postings = index.get(word)
                if postings is None:
                    postings = index[word] = _Postings()
                index_update(postings, change)
        return time.thread_time() - a
    finally:
        gc.enable()


def keyed_step(docs: int = 4_000, files: int = 2, rounds: int = 3, python: bool = False) -> dict:
    """The best of ``rounds`` (by total), as µs per change record."""
    from driftstream.engine.runtime import gc_policy
    from driftstream.examples.benchmarks.backlog import documents

    reads = arrivals(documents(docs), files)
    records = sum(len(items) for items, _ in reads)
    gc_policy.install()
    try:
        best = min((measure(reads, python) for _ in range(rounds)), key=lambda m: m["run"] + m["settle"])
        fn = min(function_only(reads) for _ in range(rounds))
    finally:
        gc_policy.uninstall()
    us = lambda s: round(s / records * 1e6, 3)  # noqa: E731
    return {"docs": docs, "files": files, "records": records, "late": best["late"], "outputs": best["outputs"],
            "path": "python" if python else "c", "us_per_record": {"run": us(best["run"]), "settle": us(best["settle"]),
                                                                   "function": us(fn)},
            "total_us_per_record": us(best["run"] + best["settle"])}


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m driftstream.examples.benchmarks.keyed_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=4_000)
    p.add_argument("--files", type=int, default=2, help="files the documents alternate between (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--python", action="store_true", help="the reference in Python instead of the C path")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    r = keyed_step(args.docs, args.files, args.rounds, args.python)
    u = r["us_per_record"]
    print(f"{r['docs']:,} documents from {r['files']} file(s), {r['records']:,} records ({r['late']:,} late), {r['path']}: "
          f"run {u['run']} + settle {u['settle']} = {r['total_us_per_record']} us a record (function alone {u['function']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
