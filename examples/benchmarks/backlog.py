"""Backlog throughput of the inverted index: every document is already in the input when
the flow starts, and the engine reads as fast as it can. The figure is documents per
second from the start of the run to its last change record made durable, less the
fixed cost of a run (starting its actors, measured with a 20-document run of the
same configuration); it shows whether the cost of an element grows with the size of
the state (the posting lists grow with every document).

Two state forms of the same index (:mod:`driftstream.examples.inverted_index.pipeline`):
``entries`` (the posting list as MapState entries, O(1) per change) and ``value`` (the
posting list a dict copied per change, O(pages holding the word)). Documents are the
corpus's article leads in a seeded shuffle, in a two-partition in-memory source; the
change records go to a FileSink and are checked against the sequential reference.

    driftstream bench backlog --docs 3000,10000 --state entries,value
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import ray

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.runtime.ray_session import ensure_ray
from driftstream.engine.testing import MemorySource
from driftstream.examples.inverted_index.corpus import iter_ovos, page_id_for
from driftstream.examples.inverted_index.ground_truth import reference_changes
from driftstream.examples.inverted_index.pipeline import build


#: The run options of a backlog run unless it says otherwise.
RUN_OPTIONS = {"guarantee": "exactly-once", "snapshot_interval": 1.0}


@dataclass(frozen=True)
class Backlog:
    """One backlog run: ``docs`` documents, the index step's ``state`` form, and the options
    of ``flow.run`` (:class:`~driftstream.engine.model.config.RunConfig` fields)."""

    docs: int
    state: str = "entries"
    parallelism: int = 2
    options: dict = field(default_factory=lambda: dict(RUN_OPTIONS))


def documents(n: int, seed: int = 0) -> list:
    """The first ``n`` article leads (with a word) of a seeded shuffle of the corpus, as
    ``{page_id, text}``; one per page (the corpus repeats a few titles: the index runs
    without edits, where a page is sent once)."""
    pages = {page_id_for(source, title): text for source, title, text, _ in iter_ovos() if text.strip()}
    rows = sorted(pages.items())
    random.Random(seed).shuffle(rows)
    return [{"page_id": page_id, "text": text} for page_id, text in rows[:n]]


def run_backlog(config: Backlog, docs: list, check: bool = True) -> dict:
    """Run the index over ``docs`` on Ray; returns the figures (and whether the output was right)."""
    work = Path(tempfile.mkdtemp(prefix="driftstream-backlog-"))
    try:
        flow = build(MemorySource(docs, partitions=2), FileSink(work / "out", name="changes"), name=f"backlog-{config.state}", state=config.state)
        started = time.perf_counter()
        result = flow.run(parallelism=config.parallelism, snapshot_dir=str(work / "snaps"), **config.options)
        seconds = time.perf_counter() - started
        figures = {
            "docs": config.docs,
            "state": config.state,
            "parallelism": config.parallelism,
            **config.options,
            "seconds": round(seconds, 2),
            "docs_per_s": round(len(docs) / seconds, 1),
            "changes": sum(result.metrics.released.values()),
            "snapshots": result.metrics.snapshots,
            "recoveries": result.metrics.recoveries,
            "peak_rss_mib": round(result.metrics.peak_rss_bytes / 2**20, 1),
            "state_cache": result.metrics.state_cache,
        }
        if check:
            got = [payload for _, payload in read_file_sink(work / "out", "changes")]
            figures["correct"] = sorted(got, key=_order) == sorted(reference_changes(docs), key=_order)
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _order(record: dict) -> tuple:
    return (record["word"], record["page_id"], record["op"], record["df"])


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench backlog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", default="3000,10000", help="document counts, comma-separated (default 3000,10000)")
    parser.add_argument("--state", default="entries,value", help="state forms, comma-separated: entries, value (default both)")
    parser.add_argument("--parallelism", "-p", type=int, default=2)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--snapshot-interval", type=float, default=1.0)
    parser.add_argument("--state-cache-mib", type=int, default=None, help="memory budget of each stateful instance's state cache (default: the engine's)")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with the sequential reference")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.docs.split(",")]
    options = {"guarantee": args.guarantee, "snapshot_interval": args.snapshot_interval}
    if args.state_cache_mib is not None:
        options["state_cache_bytes"] = args.state_cache_mib << 20
    corpus = documents(max(counts))
    rows = []
    started_ray = ensure_ray()
    try:
        for state in args.state.split(","):
            fixed = run_backlog(Backlog(20, state, args.parallelism, options), corpus[:20], check=False)["seconds"]
            for n in counts:
                config = Backlog(n, state, args.parallelism, options)
                figures = run_backlog(config, corpus[:n], check=not args.no_check)
                figures["fixed_s"] = fixed
                figures["docs_per_s_net"] = round(n / max(1e-9, figures["seconds"] - fixed), 1)
                rows.append(figures)
                print(json.dumps(figures), flush=True)
    finally:
        if started_ray:
            ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0
