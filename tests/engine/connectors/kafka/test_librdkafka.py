"""Kafka input and output as librdkafka (confluent-kafka) writes and reads it, on the local
broker: every codec in and out, with headers; transactional topics read_committed (the
records of aborted transactions never read, markers stepped over, a bounded read ending on
a partition that ends with a marker, a replay from any position giving the same elements at
the same times); a codec whose library is missing fails at once, naming what to install.

Tansu 0.6.0 sends no aborted-transaction list with its fetch answers (librdkafka's own
read_committed consumer reads aborted records from it): here the reader finds each
transaction's outcome from its marker in the log. The list itself is tested on recorded
answers (test_transactions.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import kafka.codec
import pytest
import ray

from driftstream.engine import Flow
from driftstream.engine.connectors.kafka.codecs import MissingCodec
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.sink import META_HEADER, KafkaSink, read_kafka_sink
from driftstream.engine.connectors.kafka.source import KafkaSource
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, wait_for_actor
from tests.engine.connectors.kafka.librdkafka import batch_codecs, consume, produce, producer

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def doc(i: int) -> bytes:
    # Repetitive, as JSON is: every codec makes these batches smaller, so they are compressed.
    return json.dumps({"i": i, "k": f"k{i % 4}", "text": "the quick brown fox jumps over the lazy dog " * 3}).encode()


def read_all(source: KafkaSource, partition: int, timeout_s: float = 20.0) -> list:
    """``(meta, value, position after it)`` of everything a bounded source's partition holds
    (position None when a read gave it with the next: the clock held it, see PartitionClock)."""
    reader = source.open(partition, 0)
    out: list = []
    try:
        deadline = time.time() + timeout_s
        while not reader.done:
            assert time.time() < deadline, f"{reader!r} did not end (end {reader.end})"
            got = reader.read(1)
            out += [(meta, value, reader.position() if i == len(got) - 1 else None) for i, (meta, value) in enumerate(got)]
    finally:
        reader.close()
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_in_and_out_with_headers(kafka_broker, codec):
    """librdkafka writes batches compressed with ``codec``; the flow reads them, and writes its
    output with the same codec for librdkafka to read back, Meta headers included."""
    bs = kafka_broker.bootstrap_servers
    src, dst = topic_name("codec-in"), topic_name("codec-out")
    ensure_topic(bs, src, 2)
    produce(bs, src, [(i % 2, doc(i)) for i in range(400)], compression=codec, headers=[("origin", b"librdkafka")])
    assert batch_codecs(bs, src, 0) == {codec or "none"}

    flow = Flow(f"codec-{codec}")
    flow.source(KafkaSource(src, bs, bounded=True)).map(lambda d: dict(d, seen=True)).sink(KafkaSink(dst, bs, compression=codec))
    flow.run(runtime="simulator", seed=1)

    assert batch_codecs(bs, dst, 0) == {codec or "none"}
    out = consume(bs, dst, [0])
    assert sorted(json.loads(m.value())["i"] for m in out) == list(range(400))
    assert all(dict(m.headers())[META_HEADER] for m in out)


def write_transactions(bs: str, topic: str, plan: list, compression: str = "zstd", pause_s: float = 0.0) -> list:
    """One librdkafka transactional producer writes ``plan``: ``(commit?, [(partition, value)])``
    per transaction, ``pause_s`` apart. Returns the rows of the committed ones."""
    p = producer(bs, compression, transactional_id=f"tx-{topic}")
    p.init_transactions(30)
    committed = []
    for commit, rows in plan:
        p.begin_transaction()
        for partition, value in rows:
            p.produce(topic, value, partition=partition, headers=[("txn", b"1")])
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)
        committed += rows if commit else []
        time.sleep(pause_s)
    return committed


def committed_and_aborted_plan(n_txn: int = 10, size: int = 25, start: int = 0) -> list:
    """Transactions of ``size`` rows over partitions 0 and 1, every 2nd or 5th one aborted
    (6 of 10 committed); then one aborted on partition 1 alone: partition 0 ends with a
    commit marker, partition 1 with an abort marker."""
    plan, i = [], start
    for t in range(n_txn):
        plan.append((t % 5 not in (1, 3), [(j % 2, doc(j)) for j in range(i, i + size)]))
        i += size
    plan.append((False, [(1, doc(j)) for j in range(i, i + 3)]))
    return plan


def test_a_transactional_topic_is_read_committed_and_a_replay_from_anywhere_is_the_same(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("txn")
    ensure_topic(bs, topic, 2)
    committed = write_transactions(bs, topic, committed_and_aborted_plan())
    assert len(committed) == 150

    got = {p: read_all(KafkaSource(topic, bs, bounded=True), p) for p in (0, 1)}  # both partitions end with a marker
    for p in (0, 1):
        assert [v["i"] for _, v, _ in got[p]] == [json.loads(v)["i"] for q, v in committed if q == p]
        assert [m[0] for m, _, _ in got[p]] == sorted(m[0] for m, _, _ in got[p])  # t: the running max timestamp

    uncommitted = [v["i"] for p in (0, 1) for _, v, _ in read_all(KafkaSource(topic, bs, bounded=True, isolation="read_uncommitted"), p)]
    assert sorted(uncommitted) == list(range(253))

    # Replays from positions around the aborted transactions give the same elements at the same times.
    for k in (1, 12, 13, 37, 60):
        offset, ts = got[0][k][2]
        replay = read_all(KafkaSource(topic, bs, bounded=True, start_offsets={0: (offset, ts)}), 0)
        assert [(m, v) for m, v, _ in replay] == [(m, v) for m, v, _ in got[0][k + 1:]]


def test_a_transaction_that_commits_while_an_older_one_is_open_is_read_at_once():
    """A's records come before B's, A's commit marker after them: B is still open. A reader
    must not wait for B to read A (Kafka's last stable offset lies between them). Then B
    aborts: its records are never read, what follows is.

    On librdkafka's mock cluster (a broker inside the client: ``test.mock.num.brokers``):
    Tansu 0.6.0 holds its last stable offset at the partition's oldest transaction while
    any is open, so there nothing after it is readable. The mock reports no last stable
    offset (its end instead) and no aborted-transaction list: the reader reads B's batch
    too, and its outcome only from B's marker, as it reads A's."""
    mock = producer("", transactional_id=None, mock_brokers=1)
    bs = ",".join(f"{b.host}:{b.port}" for b in mock.list_topics(timeout=10).brokers.values())
    topic = topic_name("txn-overlap")
    a, b = (producer(bs, transactional_id=f"{name}-{topic}") for name in ("a", "b"))
    for p in (a, b):
        p.init_transactions(30)
        p.begin_transaction()
    for i in range(5):
        a.produce(topic, doc(i), partition=0)
    a.flush(30)
    for i in range(100, 105):
        b.produce(topic, doc(i), partition=0)
    b.flush(30)
    a.commit_transaction(30)

    reader = KafkaSource(topic, bs, tick_interval=None).open(0, 0)
    try:
        got: list = []
        deadline = time.time() + 20
        while len(got) < 5 and time.time() < deadline:
            got += [v["i"] for _, v in reader.read(100)]
        assert got == list(range(5))
        assert reader.log.markers_read_ahead > 0
        b.abort_transaction(30)
        produce(bs, topic, [(0, doc(i)) for i in range(5, 8)])
        while len(got) < 8 and time.time() < deadline:
            got += [v["i"] for _, v in reader.read(100)]
        assert got == list(range(8))
    finally:
        reader.close()


def test_a_codec_whose_library_is_missing_fails_at_once_naming_the_package(kafka_broker, monkeypatch):
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("no-lz4")
    ensure_topic(bs, topic, 1)
    produce(bs, topic, [(0, doc(i)) for i in range(50)], compression="lz4")
    for name in ("lz4", "lz4f", "lz4framed"):  # as if the lz4 package were not installed
        monkeypatch.setattr(kafka.codec, name, None)

    with pytest.raises(FlowError, match=r"KafkaSink\('out', compression='lz4'\).*pip install lz4"):
        KafkaSink("out", bs, compression="lz4")
    with pytest.raises(FlowError, match="unknown Kafka compression 'brotli'"):
        KafkaSink("out", bs, compression="brotli")

    flow = Flow("no-lz4")
    flow.source(KafkaSource(topic, bs, bounded=True)).sink(MemorySink("out"))
    with pytest.raises(MissingCodec, match=rf"{topic}\[0\] at offset 0: .*compressed with lz4.*pip install lz4"):
        flow.run(runtime="simulator", seed=1)


def _count(n, e):
    n = (n or 0) + 1
    return n, {"k": e["k"], "i": e["i"], "n": n}


@pytest.mark.ray
def test_exactly_once_with_a_kill_over_a_transactional_topic(ray_session, kafka_broker, tmp_path):
    """librdkafka writes transactions (2 of every 5 aborted) while the flow runs; its stateful
    actor is killed once. Each key's output is that of the committed records alone, once
    each, as librdkafka reads it back."""
    bs = kafka_broker.bootstrap_servers
    topic, out, name = topic_name("eo-txn"), topic_name("eo-txn-out"), f"eo-txn-{uuid.uuid4().hex[:6]}"
    ensure_topic(bs, topic, 2)
    # 25 transactions 0.1 s apart (~3 s of input, 300 committed rows): the kill at a third of
    # the output leaves most transactions, committed and aborted, to come. Key k{i % 4} in partition i % 2.
    plan = committed_and_aborted_plan(n_txn=25, size=20)
    expected: dict = {}  # per key: the count over its committed records, in the order written
    for commit, rows in plan:
        for _, value in rows if commit else ():
            e = json.loads(value)
            key_rows = expected.setdefault(e["k"], [])
            key_rows.append({"k": e["k"], "i": e["i"], "n": len(key_rows) + 1})
    total = sum(len(v) for v in expected.values())

    flow = Flow(name)
    flow.source(KafkaSource(topic, bs), name="in").key_by(lambda e: e["k"], name="by_key").stateful_map(_count, name="count").sink(
        KafkaSink(out, bs, compression="lz4"))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    feeder = threading.Thread(target=write_transactions, args=(bs, topic, plan), kwargs={"pause_s": 0.1}, daemon=True)
    written = lambda: len(read_kafka_sink(bs, out))  # noqa: E731  (output that landed, across the recovery: status() counts since it)
    try:
        handle.status()  # answers once the flow runs: the input comes while it does
        feeder.start()
        deadline = time.time() + 120
        while handle.status()["released"] < total // 3:
            assert time.time() < deadline, handle.status()
            time.sleep(0.02)
        ray.kill(wait_for_actor(f"{name}/by_key/0", timeout=30), no_restart=True)
        while written() < total:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        recoveries = handle.status()["recoveries"]
    finally:
        feeder.join(timeout=60)
        handle.stop(timeout=60)
    got: dict = {}
    for m in consume(bs, out, [0, 1]):
        row = json.loads(m.value())
        got.setdefault(row["k"], []).append(row)
    assert len(recoveries) == 1 and recoveries[0]["snapshot"] is not None, recoveries
    assert got == expected
