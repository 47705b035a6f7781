"""Rescaling real workloads on a running flow: the inverted index (a page-keyed stage and the
word-keyed MapState index) moved 2 -> 4 -> 2 while it works through a Kafka backlog, checked
against the PySpark ground truth; a windowed count and a lookup moved 2 -> 3 -> 1 mid-stream,
checked against the sequential reference, late output and windows open across both rescales
included."""

from __future__ import annotations

import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, topic_end
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.engine.windows import Session
from driftstream.examples.benchmarks.backlog import documents
from driftstream.examples.inverted_index.corpus import QUICK_CONF, get_spark
from driftstream.examples.inverted_index.ground_truth import GroundTruth, check, ground_truth
from driftstream.examples.inverted_index import pipeline
from driftstream.examples.inverted_index.throughput import produce_backlog

from tests.engine.api.test_joins import build as join_flow
from tests.engine.api.test_windows import _as_json
from tests.engine.api.test_windows import build as window_flow
from tests.reference import reference_outputs

pytestmark = pytest.mark.ray

DOCS = 800  # article leads; every 4th page is sent again, edited, 5 sends later (enough that a rescale finds some unread)


def wait_until(count, n: int, what: str, timeout: float = 120.0, explain=lambda: "") -> int:
    """Poll ``count()`` until it reaches ``n``; returns the count. On a timeout the message
    adds ``explain()`` (a flow's status: where its watermark and sources stopped)."""
    deadline = time.time() + timeout
    while (got := count()) < n:
        assert time.time() < deadline, f"{got} of {n} {what} after {timeout} s; {explain()}"
        time.sleep(0.1)
    return got


def paced_document(raw: bytes) -> dict:
    """The index's decoding, 10 ms a document: 800 documents take a source at least 4 s, so
    that each rescale finds documents unread (unpaced, the backlog was done in ~2 s, before
    the first rescale had returned)."""
    time.sleep(0.01)
    return pipeline._document(raw)


def paced_kafka_flow(bs: str, src: str, out: str, name: str):
    """:func:`~driftstream.examples.inverted_index.pipeline.kafka_flow` with edits, decoding at :func:`paced_document`'s pace."""
    from driftstream.engine import KafkaSink, KafkaSource

    return pipeline.build(KafkaSource(src, bs, value_format=paced_document), KafkaSink(out, bs), name=name, edits=True,
                          bad_documents="dead-letter")


def edited(docs: list) -> list:
    """The send sequence: ``docs``, and every 4th page again 5 sends later with changed text
    (every other word of it, then the first words of the next page): removes, moved and new words."""
    edits = {i + 5: dict(d, text=" ".join(d["text"].split()[::2] + docs[i + 1]["text"].split()[:4]))
             for i, d in enumerate(docs[:-5]) if i % 4 == 0}
    sends = []
    for i, d in enumerate(docs):
        sends += [d] + ([edits[i]] if i in edits else [])
    return [dict(d, seq=seq) for seq, d in enumerate(sends)]


def spark_truth(sends: list, path) -> GroundTruth:
    """The PySpark ground truth of ``sends``, written as the corpus job's Parquet (seq, page_id, text)."""
    pq.write_table(pa.table({c: [s[c] for s in sends] for c in ("seq", "page_id", "text")}), path)
    spark = get_spark("driftstream-rescale-tests", conf=QUICK_CONF)
    try:
        return ground_truth(str(path), spark=spark)
    finally:
        spark.stop()


def test_the_inverted_index_rescaled_2_4_2_through_a_kafka_backlog(ray_session, kafka_broker, tmp_path):
    """Every document (with edits) is in the input topic before the flow starts at 2; it is
    rescaled to 4 after some output, and back to 2 after some output at 4, each time with
    documents still unread: posting lists (MapState entries) and pages' words follow their
    key groups, and the output topic holds exactly the ground truth's records, each once,
    every word's df sequence in order."""
    sends = edited(documents(DOCS))
    # The ground truth's Spark job runs while the flow starts and reaches its first rescale
    # (its JVM's start is most of it): needed from the second rescale on.
    truth_job = ThreadPoolExecutor(1).submit(spark_truth, sends, tmp_path / "corpus.parquet")
    bs, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    src, out = f"ii-rescale-in-{tag}", f"ii-rescale-out-{tag}"
    produce_backlog(bs, src, sends, partitions=2)
    ensure_topic(bs, out, 4)
    c = consumer(bs)

    def written() -> int:
        return topic_end(c, out, 4)

    # Sources read at most 10 documents past the watermark, at paced_document's pace: the
    # backlog is read as it is processed, so a rescale's drain leaves most of it in the topic.
    handle = paced_kafka_flow(bs, src, out, name=f"ii-rescale-{tag}").start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.5, snapshot_dir=str(tmp_path / "snaps"),
        max_inflight=10, batch_size=5)
    try:
        out_at = [0]
        for parallelism in (4, 2):
            # min: an output complete before this rescale fails the assert below, not a wait
            wanted = 1 if out_at == [0] else min(out_at[-1] + 1, len(truth_job.result().changes))
            wait_until(written, wanted, "change records", explain=lambda: f"status: {handle.status()}")
            began = time.time()
            assert handle.rescale(parallelism)["to"] == parallelism
            out_at.append(written())
            print(f"rescaled to {parallelism} in {time.time() - began:.1f} s: {out_at[-1]} change records out")
        truth = truth_job.result()
        n = len(truth.changes)
        assert any(r["op"] == "remove" for r in truth.changes)  # the edits take entries out of posting lists
        wait_until(written, n, "change records", explain=lambda: f"status: {handle.status()}")
        status = handle.status()
    finally:
        handle.stop(timeout=60)
        c.close()
    assert [(r["from"], r["to"]) for r in status["rescales"]] == [(2, 4), (4, 2)]
    assert status["parallelism"] == 2 and [len(status["key_groups"][s]) for s in ("by_page", "by_word")] == [2, 2]
    # A drain releases all that was read: output after the second one (so after the first,
    # too) came from documents still unread, read at the new parallelism.
    assert out_at[-1] < n, f"the output was complete before the last rescale ({out_at} of {n}): nothing read at the new parallelism"
    got = [v for _, v in read_kafka_sink(bs, out)]
    assert check(got, truth) == []
    assert len(got) == n  # nothing twice


def rescaled_run(flow, out, expected: int, tmp_path, steps=(3, 1)) -> list:
    """Run ``flow`` at 2, exactly-once, rescaling it to each of ``steps`` in turn, the k-th once
    k/6 of the ``expected`` outputs are in the FileSink directory ``out``, then to its end.
    Asserts that output was still to come after each rescale; returns ``(from, to)`` of each.
    (At k/4 a loaded machine's second rescale once came after the run's end.)"""
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    reports = []

    def released() -> int:
        return len(read_file_sink(out, "out"))

    try:
        for k, parallelism in enumerate(steps, start=1):
            wait_until(released, k * expected // 6, "outputs")
            report = handle.rescale(parallelism)
            assert released() < expected  # mid-stream: output was still to come
            reports.append((report["from"], report["to"]))
    finally:
        handle.wait(timeout=120)
    return reports


def window_input(n: int) -> list:
    """``(key, event ms, value)``: key "s" every 10 ms from first to last (one session
    open throughout), keys k0-k9 in 40 ms bursts 400 ms apart (a session each), every 97th
    burst element 300 ms late (late output)."""
    return [("s", i, "x") if i % 10 == 0 else (f"k{i // 40 % 10}", i - 300 * (i % 97 == 1), "y") for i in range(n)]


def test_a_session_count_rescaled_mid_stream_keeps_its_open_windows(ray_session, tmp_path):
    """Windows open at each rescale (the session of key "s" spans the whole input) are
    restored with their timers at the new parallelism: every session fires once with its
    full count, and late elements go to the late output, as in the sequential reference."""
    data = window_input(5000)
    expected = reference_outputs(window_flow(data, Session(0.02), "count", lateness=0.01))
    assert expected["late"] and [(w.start, w.value) for w in expected["out"] if w.key == "s"] == [(0.0, 500)]
    sinks = dict(sink=FileSink(tmp_path / "out", name="out"), late_sink=FileSink(tmp_path / "late", name="late"))
    flow = window_flow(data, Session(0.02), "count", lateness=0.01, name="win-rescale", rate=1000, **sinks)
    assert rescaled_run(flow, tmp_path / "out", len(expected["out"]), tmp_path) == [(2, 3), (3, 1)]
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == _as_json(expected["out"])
    assert [p for _, p in read_file_sink(tmp_path / "late", "late")] == _as_json(expected["late"])


def test_a_lookup_rescaled_mid_stream_keeps_its_table(ray_session, tmp_path):
    """The table side (each key's latest value) moves with its key groups 2 -> 3 -> 1: every
    stream element still meets the value the sequential reference gives it."""
    data = [("LR"[i % 3 == 0], f"k{i % 23}", i) for i in range(4000)]
    expected = reference_outputs(join_flow(data, "lookup"))["out"]
    flow = join_flow(data, "lookup", name="lookup-rescale", rate=1000, sink=FileSink(tmp_path / "out", name="out"))
    assert rescaled_run(flow, tmp_path / "out", len(expected), tmp_path) == [(2, 3), (3, 1)]
    assert [p for _, p in read_file_sink(tmp_path / "out", "out")] == _as_json(expected)
    # The instances the rescale to 1 killed (their stage gone: fused) left no working directory
    # (three did before: the run's end cleaned only its last plan's stages).
    assert list(Path(tempfile.gettempdir()).glob("driftstream-lookup-rescale-*")) == []
