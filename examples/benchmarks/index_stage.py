"""The inverted index's two stages in one process, with the state a run has: what an element
costs the engine without Ray, the data plane, the acker or Kafka around it.

    driftstream bench index-stage                     # 4,000 documents, 3 rounds
    driftstream bench index-stage --docs 2000 --snapshot-every 320 --json out.json

The flow of :func:`~driftstream.examples.inverted_index.pipeline.build` (documents ->
words -> key_by word -> index, ``MapState``) runs as two
:class:`~driftstream.engine.runtime.stage.StageRuntime` objects at parallelism 1, the
index's state in a :class:`~driftstream.snapshots.state_cache.StateCache` over RocksDB
(:class:`~driftstream.engine.runtime.stage_snapshots.StageSnapshots`, writing to a local
store when asked, as the simulator's does). The source reads ``CHUNK`` documents at a time; after each
read the words stage's batch goes to the index at once and the watermark moves to
``lag`` documents behind the source (a backlog). Every ``snapshot_every`` documents a
snapshot is taken and written (a base, in a backlog: more keys changed than a delta
holds) and the collector's survivors frozen, as a stage actor does every second.

Figures, µs per change record: the words stage (the source's read, ``document_words``,
routing), the index (landing, the function, ``MapState``), the watermark (folds into
the cache, the barrier's release into a memory sink) and the snapshots.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Optional

#: documents per source read
CHUNK = 8


def measure(docs: list, lag: int = 40, snapshot_every: int = 640) -> dict:
    """Seconds per part over one run of ``docs`` (dicts with ``page_id`` and ``text``) and the
    change records the index emitted."""
    from driftstream.engine.runtime.stage import StageRuntime
    from driftstream.engine.runtime.stage_snapshots import StageSnapshots
    from driftstream.engine.testing import MemorySink, MemorySource
    from driftstream.examples.inverted_index.pipeline import build
    from driftstream.ordering.meta import TOP

    plan = build(MemorySource([]), MemorySink("out")).plan(1, fuse=False)  # its two stages, timed apart
    work = tempfile.mkdtemp(prefix="index-stage-")
    snaps = StageSnapshots(Path(work, "store").as_uri(), "bench", scratch=work, deferred=True)
    words, index = (StageRuntime(plan, i, 0, seed=1, backend_factory=snaps.backend) for i in range(2))
    spent = {"words": 0.0, "index": 0.0, "watermark": 0.0, "snapshots": 0.0}
    n, snapshot_id, next_snapshot = len(docs), 0, snapshot_every
    try:
        for start in range(0, n, CHUNK):
            end = min(n, start + CHUNK)
            a = time.perf_counter()
            words.process_source([((o, 0, 0, o, (), False), docs[o]) for o in range(start, end)])
            batches = words.take_batches()
            b = time.perf_counter()
            for _, _, batch in batches:
                index.receive(batch)
                index.release_held(everything=True)
                index.take_batches()
            c = time.perf_counter()
            watermark = (end - lag, 0, 0, 0)
            for rt in (words, index):
                rt.on_watermark(watermark)
                rt.take_acks()
            d = time.perf_counter()
            if end >= next_snapshot:
                next_snapshot += snapshot_every
                snapshot_id += 1
                gc.freeze()
                snaps.take(snapshot_id, watermark, None, lambda part: None)
                while snaps.pending_writes():
                    snaps.write_next()
            spent["words"] += b - a
            spent["index"] += c - b
            spent["watermark"] += d - c
            spent["snapshots"] += time.perf_counter() - d
        for rt in (words, index):
            rt.on_watermark(TOP)
        records = len(index.collected()["out"])
    finally:
        snaps.close()
    return {"spent": spent, "records": records, "snapshots": snapshot_id}


def index_stage(docs: int = 4_000, rounds: int = 3, lag: int = 40, snapshot_every: int = 640) -> dict:
    """The best of ``rounds`` by total time, as µs per change record per part, over the
    corpus's first ``docs`` documents (as JSON documents decode: fresh dicts)."""
    import orjson

    from driftstream.engine.runtime import gc_policy
    from driftstream.examples.benchmarks.backlog import documents

    source = [orjson.loads(orjson.dumps({"page_id": d["page_id"], "text": d["text"]})) for d in documents(docs)]
    gc_policy.install()  # the stage actors' collector policy
    try:
        best = min((measure(source, lag, snapshot_every) for _ in range(rounds)), key=lambda m: sum(m["spent"].values()))
    finally:
        gc_policy.uninstall()
    records = best["records"]
    per = {part: round(s / records * 1e6, 3) for part, s in best["spent"].items()}
    return {"docs": docs, "records": records, "snapshots": best["snapshots"], "us_per_record": per,
            "total_us_per_record": round(sum(best["spent"].values()) / records * 1e6, 3)}


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="driftstream bench index-stage", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=4_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lag", type=int, default=40, help="documents the watermark trails the source by (default 40)")
    p.add_argument("--snapshot-every", type=int, default=640, help="documents between snapshots (default 640: ~1 s of a run's backlog)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    r = index_stage(args.docs, args.rounds, args.lag, args.snapshot_every)
    print(f"{r['docs']:,} documents, {r['records']:,} change records, {r['snapshots']} snapshots: "
          f"{r['total_us_per_record']} us a record")
    for part, us in r["us_per_record"].items():
        print(f"  {part:10s} {us:7.3f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0
