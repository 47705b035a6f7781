"""The sink path's unit costs, its C against the Python it keeps as the reference: what an
inverted-index instance does per released change record after its keyed step (the barrier's
adds, sort and release, the latency samples of a release, the FileSink's JSON lines).

The change records are the index's own (``document_words`` and ``index_update`` over the
corpus's leads, the documents alternated between two partitions as the files basis's two
files), with Metas as a FileSource gives them; they reach the barrier as a keyed step
emits them, a chunk of documents at a time grouped by word, and a release follows each chunk
at a watermark two chunks behind (the barrier holds what is in flight, as in a backlog).
Both paths run in one process, interleaved, round after round; a cost is the best round's
CPU time (``process_time``) per released record, with the collector as a stage actor sets it.

    python -m driftstream.examples.benchmarks.sink_path --docs 3000 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any, Callable

from driftstream.barriers import barrier as barrier_module
from driftstream.barriers.barrier import Barrier
from driftstream.engine.connectors import file_sink
from driftstream.engine.runtime import gc_policy, latency_samples
from driftstream.examples.benchmarks.backlog import documents
from driftstream.examples.inverted_index.pipeline import document_words, index_update
from driftstream.examples.inverted_index.throughput import _Postings

#: documents a keyed step's chunk holds (a drain's 4,096 elements are ~80 of the index's)
CHUNK_DOCS = 80


def chunks(n: int) -> list:
    """The index's change records as a keyed step hands them to its sink step: a list of
    ``(meta, payload, key)`` per chunk of documents, grouped by word; and each chunk's least time."""
    docs, index, out = documents(n), {}, []
    for start in range(0, n, CHUNK_DOCS):
        by_word: dict = {}
        for i in range(start, min(n, start + CHUNK_DOCS)):
            partition, offset = i % 2, i // 2
            meta_of = lambda child: (offset, 0, partition, offset, (child, 0), False)  # noqa: E731
            for child, change in enumerate(document_words(docs[i])):
                postings = index.get(change[1])
                if postings is None:
                    postings = index[change[1]] = _Postings()
                for record in index_update(postings, change):
                    by_word.setdefault(change[1], []).append((meta_of(child), record, change[1]))
        out.append([item for items in by_word.values() for item in items])
    return out


def barrier_cost(batches: list) -> tuple:
    """CPU seconds of the barrier's adds and releases, and the bundles' elements."""
    b, bundles, spent = Barrier(), [], 0.0
    for k, items in enumerate(batches):
        started = time.process_time()
        b.add_many(items)
        if k >= 2:
            bundles.append(b.release((batches[k - 2][0][0][0] + 1,)).elements)
        spent += time.process_time() - started
    started = time.process_time()
    bundles.append(b.release((1 << 62,)).elements)
    return spent + time.process_time() - started, bundles


def each(fn: Callable[[Any], Any], bundles: list) -> float:
    started = time.process_time()
    for bundle in bundles:
        fn(bundle)
    return time.process_time() - started


def measure(batches: list, native: bool) -> dict:
    """Per released record, seconds: the barrier, the latency samples, the FileSink's lines."""
    saved = barrier_module.NATIVE, latency_samples.NATIVE
    barrier_module.NATIVE, latency_samples.NATIVE = saved if native else (None, None)
    try:
        spent, bundles = barrier_cost(batches)
        samples = latency_samples.LatencySamples(max_samples=1 << 30)
        lines = file_sink.json_lines if native else file_sink.python_json_lines
        n = sum(map(len, bundles))
        return {"barrier": spent / n, "latency samples": each(lambda b: samples.add(b, 1.0), bundles) / n,
                "file lines": each(lines, bundles) / n, "records": n}
    finally:
        barrier_module.NATIVE, latency_samples.NATIVE = saved


def main(argv: Any = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if barrier_module.NATIVE is None or file_sink.NATIVE is None:
        raise SystemExit("the C accelerators are not built (pip install -e .): nothing to compare")
    batches = chunks(args.docs)
    best: dict = {}
    ours = gc_policy.freeze_after_full_collection not in gc.callbacks
    gc_policy.install()  # as a stage actor runs
    try:
        for r in range(args.rounds):
            for native in ((True, False) if r % 2 else (False, True)):
                for part, cost in measure(batches, native).items():
                    if part != "records":
                        key = ("c" if native else "python", part)
                        best[key] = min(best.get(key, 1.0), cost)
    finally:
        if ours:
            gc_policy.uninstall()  # a caller's process (a test's) keeps its own collector
    result = {"docs": args.docs, "records": sum(map(len, batches)), "rounds": args.rounds,
              "us_per_record": {path: {part: round(1e6 * best[(path, part)], 3) for part in ("barrier", "latency samples", "file lines")}
                                for path in ("python", "c")}}
    for path in ("python", "c"):
        result["us_per_record"][path]["sink path"] = round(sum(result["us_per_record"][path].values()), 3)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
