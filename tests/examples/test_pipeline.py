"""The driftstream inverted index: any arrival order gives the sequential reference's change
records (df included), with and without edits; on Ray between real Kafka topics, too."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.examples.inverted_index.documents import rebuild_index
from driftstream.examples.inverted_index.ground_truth import reference_changes, reference_index
from driftstream.examples.inverted_index.arrow_words import document_words_batch
from driftstream.examples.inverted_index.pipeline import build, document_words

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]

documents = st.lists(
    st.tuples(st.integers(0, 5), st.lists(st.sampled_from(WORDS), min_size=1, max_size=8)),
    min_size=1,
    max_size=25,
)


def _docs(raw: list, edits: bool) -> list:
    docs, seen = [], set()
    for i, (page, words) in enumerate(raw):
        page_id = page if edits else i  # without edits every page is sent once
        if not edits and page_id in seen:
            continue
        seen.add(page_id)
        docs.append({"page_id": page_id, "title": f"p{page_id}", "text": " ".join(words)})
    return docs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=documents, edits=st.booleans(), parallelism=st.integers(1, 3), seed=st.integers(0, 10_000), state=st.sampled_from(["entries", "value"]),
       arrow=st.booleans())
def test_any_arrival_order_gives_the_reference(raw, edits, parallelism, seed, state, arrow):
    docs = _docs(raw, edits)
    words = "arrow" if arrow and not edits else "python"
    result = build(MemorySource(docs, partitions=2), MemorySink("changes"), edits=edits, state=state, words=words).run(
        runtime="simulator", parallelism=parallelism, seed=seed
    )
    got = result.output("changes")  # merged over sink partitions in t order: send order, then word order
    assert got == reference_changes(docs)
    assert rebuild_index(got) == reference_index(docs)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab Z9_,.-'\n\tİÉéßΣΑς日本 \u0301", max_size=20), min_size=1, max_size=12))
def test_arrow_words_are_pythons_words(texts):
    # the same words, positions and order as document_words: Python's \w and lower() ("İ"
    # included; Python's final sigma is the one difference, so no upper-case sigma at a word's end)
    texts = [t.replace("Σ", "Σa") for t in texts]
    docs = [{"page_id": i, "text": t} for i, t in enumerate(texts)]
    rows, parents = document_words_batch(pa.RecordBatch.from_pylist(docs))
    got = [tuple(r.values()) for r in rows.to_pylist()]
    assert got == [c for d in docs for c in document_words(d)]
    assert parents.to_pylist() == [d["page_id"] for d in docs for _ in document_words(d)]


def test_a_page_sent_again_yields_removes_and_changed_adds():
    docs = [
        {"page_id": 1, "text": "a b"},
        {"page_id": 2, "text": "b"},
        {"page_id": 1, "text": "b c b"},
    ]
    got = build(MemorySource(docs), MemorySink("c"), edits=True).run(runtime="simulator", seed=1).output("c")
    assert got == [
        {"op": "add", "word": "a", "page_id": 1, "positions": [0], "df": 1},
        {"op": "add", "word": "b", "page_id": 1, "positions": [1], "df": 1},
        {"op": "add", "word": "b", "page_id": 2, "positions": [0], "df": 2},
        {"op": "remove", "word": "a", "page_id": 1, "df": 0},
        {"op": "add", "word": "b", "page_id": 1, "positions": [0, 2], "df": 2},
        {"op": "add", "word": "c", "page_id": 1, "positions": [1], "df": 1},
    ]


@pytest.mark.ray
def test_kafka_to_kafka_on_ray_with_a_malformed_document(ray_session, kafka_broker):
    import json

    from kafka import KafkaProducer

    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.kafka.sink import read_kafka_sink
    from driftstream.examples.inverted_index.pipeline import kafka_flow

    bs = kafka_broker.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    src, out = f"ii-in-{tag}", f"ii-out-{tag}"
    ensure_topic(bs, src, 1)
    ensure_topic(bs, out, 2)
    docs = [{"page_id": i, "title": f"t{i}", "text": f"w{i % 3} common w{i % 5} common", "sent_at_ms": 0.0} for i in range(40)]
    p = KafkaProducer(bootstrap_servers=bs)
    for i, d in enumerate(docs):
        p.send(src, json.dumps(d).encode(), partition=0)
        if i == 10:
            p.send(src, b'{"page_id": "not an int"}', partition=0)  # malformed: dead-lettered
    p.flush()
    p.close()
    handle = kafka_flow(bs, src, out, name=f"ii-{tag}").start(parallelism=2)
    want = reference_changes(docs)
    try:
        import time

        deadline = time.time() + 90
        got = []
        while time.time() < deadline and len(got) < len(want):
            got = [v for _, v in read_kafka_sink(bs, out)]
            time.sleep(0.5)
        assert handle.status()["dead_letters"] == 1
    finally:
        handle.stop(timeout=60)
    assert got == want  # read back merged in t order
    assert rebuild_index(got) == reference_index(docs)


def _many_docs(n: int) -> list:
    """Pages sharing a small vocabulary: each word's posting list grows with every page."""
    return [{"page_id": i, "text": " ".join(WORDS[(i * j) % len(WORDS)] + str(j % 7) for j in range(1, 12))} for i in range(n)]


def test_the_index_within_a_small_state_budget_survives_crashes_on_the_simulator():
    """Entries evicted from memory, read back from RocksDB, snapshotted and restored after
    seeded crashes: the change records are still the reference's."""
    from driftstream.engine.model.config import RunConfig
    from driftstream.engine.runtime.simulator import Simulation

    docs = _many_docs(200)
    read_back, crashed = [], []
    for seed in range(8):  # whether a schedule reads entries back, or crashes at all, depends on it: some must
        flow = build(MemorySource(docs, partitions=2), MemorySink("changes"))
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=0.02, state_cache_bytes=10_000)
        sim = Simulation(flow.plan(2), config, crashes=2)
        result = sim.run()
        assert result.output("changes") == reference_changes(docs), seed
        cache = result.metrics.state_cache["index"]
        assert cache["budget"] == 10_000 and cache["bytes"] <= 2 * 10_000  # two instances
        assert cache["evicted"] + cache["spilled"] > 0
        read_back.append(cache["read_back"])
        crashed.append(len(sim.crash_points))
    assert sum(n > 0 for n in read_back) >= 2, read_back
    assert sum(n > 0 for n in crashed) >= 4, crashed


@pytest.mark.ray
def test_the_index_without_snapshots_spills_entries_to_stay_in_its_budget(ray_session):
    docs = _many_docs(300)
    result = build(MemorySource(docs, partitions=2), MemorySink("changes"), name="ii-budget").run(parallelism=2, state_cache_bytes=8_000)
    assert result.output("changes") == reference_changes(docs)
    cache = result.metrics.state_cache["index"]
    assert cache["bytes"] <= 2 * 8_000 and cache["spilled"] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_the_index_over_a_kafka_backlog_with_spilled_state_survives_kills(ray_session, kafka_broker, tmp_path):
    """State far over its budget (entries evicted, spilled, read back from RocksDB) and the
    stateful actors killed mid-backlog: restored from incremental snapshots, the output
    topic holds the reference's change records, each once."""
    import time

    import ray

    from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, topic_end
    from driftstream.engine.connectors.kafka.sink import read_kafka_sink
    from driftstream.engine.testing import wait_for_actor
    from driftstream.examples.benchmarks.backlog import documents
    from driftstream.examples.inverted_index.ground_truth import GroundTruth, check
    from driftstream.examples.inverted_index.pipeline import kafka_flow
    from driftstream.examples.inverted_index.throughput import produce_backlog

    bs, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    src, out, name = f"ii-kill-in-{tag}", f"ii-kill-out-{tag}", f"ii-kill-{tag}"
    docs = documents(900)
    want = reference_changes(docs)
    produce_backlog(bs, src, docs, partitions=2)
    ensure_topic(bs, out, 2)
    c = consumer(bs)

    def written() -> int:
        return topic_end(c, out, 2)

    handle = kafka_flow(bs, src, out, name=name).start(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.5, snapshot_dir=str(tmp_path / "snaps"),
        state_cache_bytes=256 << 10,
    )
    over_budget = {}
    try:
        for k, victim in enumerate([f"{name}/by_word/0", f"{name}/by_word/1"], start=1):
            deadline = time.time() + 120
            while written() < k * len(want) // 4 and time.time() < deadline:
                time.sleep(0.05)
            if k == 1:
                over_budget = handle.status()["state_cache"]["index"]  # metrics at the end are the last incarnation's
            ray.kill(wait_for_actor(victim), no_restart=True)
            while len(handle.status().get("recoveries", [])) < k and time.time() < deadline:
                time.sleep(0.1)  # the kill is seen (the output may be complete already)
        deadline = time.time() + 180
        while written() < len(want) and time.time() < deadline:
            time.sleep(0.2)
        status = handle.status()
    finally:
        handle.stop(timeout=120)
        c.close()
    got = [v for _, v in read_kafka_sink(bs, out)]
    assert len(status["recoveries"]) == 2
    assert check(got, GroundTruth(index=reference_index(docs), changes=want)) == []
    assert len(got) == len(want)  # nothing twice
    assert over_budget["evicted"] + over_budget["spilled"] > 0
    # Which snapshot a kill restores depends on timing (in a backlog, snapshots are slow), so
    # whether restored entries are read back is not certain here: the simulator's test
    # above restores over-budget state at seeded points and checks it.
