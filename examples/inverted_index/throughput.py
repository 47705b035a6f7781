"""Backlog throughput of the inverted index, engine against engine, in one invocation.

Every engine starts on the same N prepared documents already in place (the
corpus's article leads, one per page, :func:`driftstream.examples.benchmarks.backlog.documents`),
exactly-once, parallelism 2, on this machine, one after the other:

- **driftstream**: the documents in a two-partition Kafka input topic (the local
  Tansu or any broker), :func:`.pipeline.kafka_flow` with entry state, 1 s
  snapshots; a consumer process stamps the change records as they appear in the
  output topic. A document is done when all its change records are there.
- **Spark**: its native SQL streaming query over JSON-lines files
  (:mod:`.spark_native`): the strongest form here (no Kafka jar). Done by micro-batch
  (1,000 documents each; ``spark-one-batch``: the whole backlog as one, issue 57's Kafka basis).
- **Flink** (optional, ``apache-flink`` is not in the default install): the PyFlink
  job of :mod:`.flink_baseline` over files, checkpoints every second, output visible
  when the file sink commits. Done by checkpoint.
- **Bytewax** (optional, ``bytewax`` is not in the default install): the job of
  :mod:`.bytewax_baseline` over the same files, two processes, state snapshots every
  second; a record counts when its line is written. Done when all its records are.

Figures per engine: documents/s and change records/s over the run (from the
engine's start to its last output), and the rate of each fifth of the documents
(is the last fifth, with the biggest index, slower than the first?).

    driftstream bench inverted-index --throughput --docs 10000
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from driftstream.examples.inverted_index.documents import word_positions

#: Fifths: the run is cut by documents done (the first fifth of the documents to finish, ...).
FIFTHS = 5


def fifth_rates(start: float, completions: Sequence[tuple], total: int, parts: int = FIFTHS) -> list:
    """Documents/s in each fifth of the documents, from ``completions`` ``(time_s, documents
    done then)`` in time order; between two completions documents finish at an even pace
    (an engine that finishes them by batches: a micro-batch, a checkpoint).

    >>> fifth_rates(0.0, [(1.0, 50), (3.0, 50)], 100)      # 50 in the first second, 50 in the next two
    [50.0, 50.0, 33.33, 25.0, 25.0]
    >>> fifth_rates(10.0, [(12.0, 100)], 100)
    [50.0, 50.0, 50.0, 50.0, 50.0]
    >>> fifth_rates(0.0, [(1.0, 1)] * 50 + [(2.0, 1)] * 50, 100)   # two commits of 50
    [50.0, 50.0, 50.0, 50.0, 50.0]
    """
    merged: list = []
    for t, n in completions:  # documents done at one instant (a commit, a poll) finished since the last
        if merged and t <= merged[-1][0]:
            merged[-1][1] += n
        else:
            merged.append([t, n])
    completions = merged
    size = total / parts
    rates, done, last_t = [], 0, start
    boundaries = [size * (k + 1) for k in range(parts)]
    prev_boundary_t = start
    for t, n in completions:
        done_after = done + n
        while boundaries and boundaries[0] <= done_after + 1e-9:
            # the time the boundary was crossed, interpolated within (last_t, t]
            share = (boundaries[0] - done) / n if n else 1.0
            crossed = last_t + share * (t - last_t)
            rates.append(float(f"{size / max(crossed - prev_boundary_t, 1e-9):.4g}"))
            prev_boundary_t = crossed
            boundaries.pop(0)
        done, last_t = done_after, t
    return rates


def summary(engine: str, docs: int, records: int, start: float, completions: Sequence[tuple], problems: list, **extra) -> dict:
    """An engine's figures from its start time and completions ``(time_s, documents done)``.

    ``docs_per_s_after_first_output`` leaves out the start (actors, a JVM, a first
    micro-batch): the documents done after the first completion over the time since.

    >>> s = summary("x", 100, 1000, 0.0, [(1.0, 50), (4.0, 50)], [])
    >>> s["seconds"], s["docs_per_s"], s["records_per_s"], s["docs_per_s_after_first_output"], s["correct"]
    (4.0, 25.0, 250.0, 16.7, True)
    """
    end = completions[-1][0] if completions else start
    first = completions[0][0] if completions else start
    seconds = max(end - start, 1e-9)
    done = sum(n for _, n in completions)
    after_first = done - (completions[0][1] if completions else 0)
    if done != docs:
        problems = problems + [f"{done} of {docs} documents done"]
    return {
        "engine": engine,
        "docs": docs,
        "records": records,
        "seconds": round(seconds, 2),
        "docs_per_s": round(docs / seconds, 1),
        "records_per_s": round(records / seconds, 1),
        "docs_per_s_after_first_output": round(after_first / (end - first), 1) if end > first else None,
        "fifths_docs_per_s": fifth_rates(start, completions, docs),
        "correct": not problems,
        "problems": problems[:10],
        **extra,
    }


def document_completions(docs: Sequence[dict], arrivals: Sequence[tuple]) -> list:
    """``(time_s, 1)`` per document, when the last of its change records arrived
    (``arrivals``: ``(recv_ms, record)`` in arrival order; one send per page).

    >>> docs = [{"page_id": 1, "text": "a b"}, {"page_id": 2, "text": "c"}]
    >>> document_completions(docs, [(1000.0, {"page_id": 1}), (1500.0, {"page_id": 2}), (2000.0, {"page_id": 1})])
    [(1.5, 1), (2.0, 1)]
    """
    left = {d["page_id"]: len(word_positions(d["text"])) for d in docs}
    out = []
    for recv_ms, record in arrivals:
        page = record.get("page_id")
        if page in left:
            left[page] -= 1
            if left[page] == 0:
                out.append((recv_ms / 1000.0, 1))
    return out


def produce_backlog(bootstrap: str, topic: str, docs: Sequence[dict], partitions: int = 2) -> None:
    """Write ``docs`` to ``topic`` (created with ``partitions``), round robin over partitions.

    Record timestamps rise by 1 ms per document, so the source's order of the records
    (running timestamp, then partition and offset) is the list's order whatever the
    partitioning, and the sequential reference over the list is the expected output."""
    from kafka import KafkaProducer

    from driftstream.engine.connectors.kafka.io import ensure_topic

    ensure_topic(bootstrap, topic, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024,
                             max_request_size=4 * 1024 * 1024, enable_idempotence=False)
    try:
        base = int(time.time() * 1000) - len(docs)
        for i, d in enumerate(docs):
            value = json.dumps({"page_id": d["page_id"], "text": d["text"]}).encode()
            producer.send(topic, value=value, partition=i % partitions, timestamp_ms=base + i)
        producer.flush()
    finally:
        producer.close()


def run_driftstream(docs: Sequence[dict], bootstrap: str, workdir: Path, parallelism: int = 2,
                    snapshot_interval: float = 1.0, state: str = "entries", timeout: Optional[float] = None,
                    state_cache_bytes: Optional[int] = None, flames: Optional[Path] = None, words: str = "python",
                    warm: bool = False, **options) -> dict:
    """The index flow over ``docs`` already in a Kafka topic, exactly-once; figures and the check.
    ``options``: more run options (e.g. ``source_alignment``); ``flames``: a directory for a
    py-spy flame graph of each actor of the run (:mod:`driftstream.examples.benchmarks.flames`);
    ``warm``: the flow's stage actors and acker started before its clock starts (:func:`~driftstream.engine.warm_up`).

    Beyond :func:`summary`'s: snapshots committed and their durations (marker to durable),
    the largest resident memory of an instance, and per stateful step its elements, those
    that arrived out of order (drifting state repaired each) and the tombstones it emitted."""
    from driftstream.engine.connectors.kafka.io import ensure_topic

    from .ground_truth import GroundTruth, check, reference_changes, reference_index
    from .measure import OutputMeter
    from .pipeline import kafka_flow

    tag = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"tp-{tag}-in", f"tp-{tag}-out"
    produce_backlog(bootstrap, in_topic, docs, partitions=2)
    ensure_topic(bootstrap, out_topic, parallelism)
    expected = sum(len(word_positions(d["text"])) for d in docs)
    meter = OutputMeter(bootstrap, out_topic).start()
    handle = None
    recorders = None
    flow = kafka_flow(bootstrap, in_topic, out_topic, name=f"throughput-{tag}", state=state, words=words)
    from driftstream.engine.control.warm_actors import fresh_pool

    with fresh_pool(flow.plan(parallelism) if warm else None):  # new processes, or warm ones, as the row says
        try:
            start = time.time()
            handle = flow.start(
                parallelism=parallelism, guarantee="exactly-once", snapshot_interval=snapshot_interval,
                snapshot_dir=str(workdir / f"snapshots-{tag}"),
                **({} if state_cache_bytes is None else {"state_cache_bytes": state_cache_bytes}), **options,
            )
            if flames is not None:
                from driftstream.examples.benchmarks.flames import Flames

                recorders = Flames(flames, match="ray::")
                recorders.attach("driftstream-")
            meter.wait_for(expected, timeout=timeout or max(300.0, len(docs) / 10.0))
            status = handle.status()
        finally:
            if recorders is not None:
                recorders.stop()
            arrivals = meter.stop()
            result = handle.stop() if handle is not None else None
    records = [r for _, r in arrivals]
    truth = GroundTruth(index=reference_index(docs), changes=reference_changes(docs))
    return summary(
        ENGINE_LABELS[words] + (", warm actors" if warm else ""), len(docs), len(records), start, document_completions(docs, arrivals), check(records, truth),
        snapshots=result.metrics.snapshots if result else None,
        snapshot_s=_snapshot_durations(result.metrics.snapshot_s) if result else None,
        recoveries=len(status.get("recoveries", [])),
        peak_rss_mib=round(result.metrics.peak_rss_bytes / 2**20, 1) if result else None,
        repairs={step: {"elements": f["elements"], "out_of_order": f["out_of_order"], "tombstones": f["tombstones"]}
                 for step, f in status.get("steps", {}).items() if "out_of_order" in f},
    )


def _snapshot_durations(seconds: Sequence[float]) -> dict:
    """Median and longest snapshot, seconds.

    >>> _snapshot_durations([0.1, 0.3, 2.0])
    {'p50': 0.3, 'max': 2.0}
    """
    ordered = sorted(seconds)
    return {"p50": round(ordered[len(ordered) // 2], 2), "max": round(ordered[-1], 2)} if ordered else {}


def run_spark(docs: Sequence[dict], workdir: Path, docs_per_batch: int = 1000) -> dict:
    """Spark's native streaming query over ``docs`` as files (:mod:`.spark_native`), ``docs_per_batch``
    a micro-batch (``len(docs)``: the whole backlog as one, issue 57's Kafka basis)."""
    from .spark_native import run_spark_native

    r = run_spark_native(docs, workdir / f"spark-{uuid.uuid4().hex[:8]}", docs_per_batch=docs_per_batch)
    label = "spark (native SQL, one micro-batch)" if docs_per_batch >= len(docs) else "spark (native SQL)"
    return summary(label, len(docs), r["rows_out"], r["started"], r["completions"], r["problems"],
                   docs_per_batch=r["docs_per_batch"], output="(word, df) per changed word per micro-batch",
                   seconds_with_jvm_start=r["seconds_total"])


def run_flink(docs: Sequence[dict], workdir: Path, checkpoint_interval: float = 1.0, python: Optional[str] = None) -> dict:
    """Flink's exactly-once job over ``docs`` as files (:mod:`.flink_baseline`)."""
    from .flink_baseline import run_flink_backlog

    r = run_flink_backlog(list(docs), workdir / f"flink-{uuid.uuid4().hex[:8]}", checkpoint_interval=checkpoint_interval, python=python)
    return {**{k: v for k, v in r.items() if k != "completions"}, "output": "one record per change, visible per checkpoint"}


def run_bytewax(docs: Sequence[dict], workdir: Path, snapshot_interval: int = 1, python: Optional[str] = None) -> dict:
    """Bytewax's job over ``docs`` as files, recovery on (:mod:`.bytewax_baseline`)."""
    from .bytewax_baseline import run_bytewax_backlog

    r = run_bytewax_backlog(list(docs), workdir / f"bytewax-{uuid.uuid4().hex[:8]}", snapshot_interval=snapshot_interval, python=python)
    return {**{k: v for k, v in r.items() if k != "completions"},
            "output": "one record per change, counted when written (a resume truncates to the last snapshot)"}


#: The engines of a throughput run, in their default order ("driftstream-arrow": the same flow
#: with its documents' words found by Arrow a batch at a time, ``build(words="arrow")``).
ENGINES = ("driftstream", "driftstream-arrow", "driftstream-warm", "spark", "spark-one-batch", "flink", "bytewax")

#: The label of driftstream's row, by the flow's form of its first step.
ENGINE_LABELS = {"python": "driftstream", "arrow": "driftstream (Arrow words)"}


def table(rows: Sequence[dict]) -> str:
    """The figures as a Markdown table.

    >>> print(table([summary("x", 100, 1000, 0.0, [(1.0, 50), (4.0, 50)], [])]))
    | engine | documents | seconds | docs/s | records/s | docs/s after the first output | fifths, docs/s | correct |
    |---|---:|---:|---:|---:|---:|---|---|
    | x | 100 | 4.0 | 25.0 | 250.0 | 16.7 | 50 / 50 / 25 / 17 / 17 | yes |
    """
    lines = ["| engine | documents | seconds | docs/s | records/s | docs/s after the first output | fifths, docs/s | correct |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        fifths = " / ".join(f"{x:.0f}" for x in r.get("fifths_docs_per_s", []))
        lines.append(f"| {r['engine']} | {r['docs']:,} | {r['seconds']} | {r['docs_per_s']} | {r['records_per_s']} | "
                     f"{r.get('docs_per_s_after_first_output')} | {fifths} | {'yes' if r.get('correct') else 'NO'} |")
    return "\n".join(lines)


class _Postings(dict):
    """A posting list with MapState's methods, for the plain loop."""

    put = dict.__setitem__

    def remove(self, key: Any) -> None:
        self.pop(key, None)


def plain_loop(docs: Sequence[dict], rounds: int = 3) -> dict:
    """The flow's own per-element work in one Python thread, no engine: each document's
    record decoded from JSON, :func:`~.pipeline.document_words`, the posting list of each
    word through :func:`~.pipeline.index_update`, each change record encoded as JSON (as the
    Kafka sink's value). Best of ``rounds``; the yardstick of the engine overhead ratio.

    >>> r = plain_loop([{"page_id": 1, "text": "a b a"}, {"page_id": 2, "text": "b"}], rounds=1)
    >>> r["docs"], r["records"]
    (2, 3)
    """
    import orjson

    from .pipeline import document_words, index_update

    raw = [orjson.dumps({"page_id": d["page_id"], "text": d["text"]}) for d in docs]
    best, records = float("inf"), 0
    for _ in range(rounds):
        index: dict = {}
        records, began = 0, time.perf_counter()
        for value in raw:
            for change in document_words(orjson.loads(value)):
                postings = index.get(change[1])
                if postings is None:
                    postings = index[change[1]] = _Postings()
                for out in index_update(postings, change):
                    orjson.dumps(out)
                    records += 1
        best = min(best, time.perf_counter() - began)
    expected = sum(len(document_words(d)) for d in docs)  # one record per distinct word of each new page
    return {"engine": "plain Python loop (1 thread)", "docs": len(docs), "records": records, "seconds": round(best, 3),
            "docs_per_s": round(len(docs) / best, 1), "records_per_s": round(records / best, 1), "correct": records == expected}


def overhead_ratio(engine: dict, loop: dict) -> float:
    """The engine's docs/s (2 cores, exactly-once, through Kafka) over the plain loop's (1
    thread): 1.0 would be Python's own pace on one core.

    >>> overhead_ratio({"docs_per_s": 300.0}, {"docs_per_s": 3000.0})
    0.1
    """
    return round(engine["docs_per_s"] / loop["docs_per_s"], 3)


def run_all(docs: Sequence[dict], engines: Sequence[str], bootstrap: Optional[str], workdir: Path,
            report: Callable[[dict], None] = lambda r: None, pythons: Optional[dict] = None, flames: Optional[Path] = None) -> list:
    """Each engine in turn over the same ``docs``; ``report`` sees each engine's figures as they come
    (``pythons``: the interpreters of the engines kept out of driftstream's install, by name; ``flames``:
    py-spy flame graphs of driftstream's actors there)."""
    pythons = pythons or {}
    runs = {
        "driftstream": lambda: run_driftstream(docs, bootstrap, workdir, flames=flames),
        "driftstream-arrow": lambda: run_driftstream(docs, bootstrap, workdir, flames=flames, words="arrow"),
        # the flow's actors started before its clock, as a session serving flows keeps them
        "driftstream-warm": lambda: run_driftstream(docs, bootstrap, workdir, flames=flames, warm=True),
        "spark": lambda: run_spark(docs, workdir),
        # issue 57's Kafka basis: Spark reads the whole backlog as one micro-batch
        "spark-one-batch": lambda: run_spark(docs, workdir, docs_per_batch=len(docs)),
        "flink": lambda: run_flink(docs, workdir, python=pythons.get("flink")),
        "bytewax": lambda: run_bytewax(docs, workdir, python=pythons.get("bytewax")),
    }
    return run_engines(runs, engines, report)


def run_engines(runs: dict, engines: Sequence[str], report: Callable[[dict], None], basis: str = "") -> list:
    """``runs[engine]()`` for each of ``engines`` in turn, each row reported as it comes; an
    engine ``runs`` does not know is refused before any runs.

    >>> run_engines({"a": lambda: {"engine": "a"}}, ["a"], print)
    {'engine': 'a'}
    [{'engine': 'a'}]
    >>> run_engines({"a": dict}, ["b"], print, "of the files basis ")
    Traceback (most recent call last):
    ...
    ValueError: unknown engine(s) of the files basis b: choose from a
    """
    unknown = [e for e in engines if e not in runs]
    if unknown:
        raise ValueError(f"unknown engine(s) {basis}{', '.join(unknown)}: choose from {', '.join(runs)}")
    rows = []
    for engine in engines:
        rows.append(runs[engine]())
        report(rows[-1])
    return rows
