"""Kafka connectors against a real Kafka-protocol broker (Tansu): times from the log,
Meta headers and t_last read back, dead letters, replay from offsets."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from driftstream.engine import Flow
from driftstream.engine.model.errors import FlowError
from driftstream.engine.connectors.kafka.io import ensure_topic, partition_count, read_partition
from driftstream.engine.connectors.kafka.sink import KafkaSink, read_kafka_sink
from driftstream.engine.connectors.kafka.source import TICK_MARK, KafkaSource
from driftstream.engine.testing import MemorySink
from driftstream.ordering.meta import Meta

pytestmark = pytest.mark.ray


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bs: str, topic: str, records: list) -> None:
    """records: (partition, timestamp_ms, value bytes)."""
    p = KafkaProducer(bootstrap_servers=bs)
    for partition, ts, value in records:
        p.send(topic, value=value, partition=partition, timestamp_ms=ts)
    p.flush()
    p.close()


def running_sum(state, doc):
    total = (state or 0) + doc["v"]
    return total, [doc["k"], total]


def expected_sums(docs: list) -> list:
    """Sequential reference over (time, doc) pairs."""
    totals: dict = {}
    out = []
    for _, doc in sorted(docs, key=lambda e: e[0]):
        totals[doc["k"]] = totals.get(doc["k"], 0) + doc["v"]
        out.append([doc["k"], totals[doc["k"]]])
    return out


def test_kafka_to_kafka_on_ray_with_meta_headers_and_dead_letters(ray_session, kafka_broker):
    bs = kafka_broker.bootstrap_servers
    src, dst = topic_name("in"), topic_name("out")
    ensure_topic(bs, src, 3)
    records, docs, bad = [], [], 0
    running = {0: None, 1: None, 2: None}
    for i in range(600):
        part = i % 3
        ts = 1000 + (i * 7919) % 500  # timestamps out of order within a partition
        running[part] = ts if running[part] is None else max(running[part], ts)
        offset = i // 3
        if i % 41 == 5:
            records.append((part, ts, b'{"k": broken'))
            bad += 1
        elif i % 53 == 9:
            records.append((part, ts, b'"not an object"'))  # valid JSON, wrong shape: the decoder rejects it
            bad += 1
        else:
            doc = {"k": "abcd"[i % 4], "v": i}
            records.append((part, ts, json.dumps(doc).encode()))
            docs.append(((running[part], 0, part, offset), doc))
    produce(bs, src, records)

    def decode(raw: bytes) -> dict:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or set(doc) != {"k", "v"}:
            raise ValueError(f"expected an object with k and v, got {type(doc).__name__}")
        return doc

    flow = Flow("k2k")
    flow.source(KafkaSource(src, bs, value_format=decode, bounded=True), name="docs").key_by(lambda d: d["k"]).stateful_map(
        running_sum, name="sum"
    ).sink(KafkaSink(dst, bs))
    result = flow.run(parallelism=2)

    out = read_kafka_sink(bs, dst)
    assert [v for _, v in out] == expected_sums(docs)
    assert [tuple(m)[:4] for m, _ in out] == [t for t, _ in sorted(docs, key=lambda e: e[0])]
    assert result.metrics.dead_letters == bad

    # The dead-letter topic: each bad record once, at its own t, with where it is and what it held.
    dlq = read_kafka_sink(bs, f"{src}.dlq")
    assert len(dlq) == bad and result.metrics.step_dead_letters == {"docs": bad}
    letters = [d for _, d in dlq]
    assert {d["step"] for d in letters} == {"docs"}
    assert sorted((d["element"]["partition"], d["element"]["offset"], d["element"]["value"].encode()) for d in letters) == sorted(
        (i % 3, i // 3, v) for i, (_, _, v) in enumerate(records) if v in (b'{"k": broken', b'"not an object"'))
    errors = [d["error"] for d in letters]
    assert any("JSONDecodeError" in e for e in errors) and any("expected an object with k and v" in e for e in errors)

    # Each sink partition can say what it holds last: the Meta of its last message.
    sink = KafkaSink(dst, bs)
    lasts = {sink.open(i, 2).t_last() for i in range(2)} - {None}
    assert max(lasts) == out[-1][0]  # the last message overall is the last of its partition
    assert all(isinstance(m, Meta) and m in {meta for meta, _ in out} for m in lasts)


def test_replay_from_saved_offsets_reproduces_the_same_times(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("replay")
    ensure_topic(bs, topic, 1)
    produce(bs, topic, [(0, ts, json.dumps(i).encode()) for i, ts in enumerate([5, 3, 9, 4, 12, 11, 2, 20])])

    def run(start_offsets=None):
        flow = Flow("replay")
        flow.source(KafkaSource(topic, bs, bounded=True, start_offsets=start_offsets)).sink(MemorySink("out"))
        return flow.run(runtime="simulator", seed=1).output_with_meta("out")

    full = run()
    assert [m.ts for m, _ in full] == [5, 5, 9, 9, 12, 12, 12, 20]  # running max of timestamps
    tail = run({0: (4, 9)})  # replay from offset 4 with the running ts saved there
    assert tail == full[4:]


def test_an_empty_sink_partition_has_no_t_last(kafka_broker):
    sink = KafkaSink(topic_name("empty"), kafka_broker.bootstrap_servers)
    assert sink.open(0, 1).t_last() is None


def test_a_missing_input_topic_fails_with_what_to_do(kafka_broker, monkeypatch):
    import functools

    from driftstream.engine.connectors.kafka import source as kafka_source

    # The source waits up to partition_count's timeout (10 s) for the topic's metadata before it
    # calls the topic missing; 1 s here: the same answer, sooner.
    monkeypatch.setattr(kafka_source, "partition_count", functools.partial(partition_count, timeout=1.0))
    flow = Flow("missing")
    flow.source(KafkaSource("no-such-topic-" + uuid.uuid4().hex[:6], kafka_broker.bootstrap_servers)).sink(MemorySink("o"))
    with pytest.raises(Exception, match="does not exist .* create it first"):
        flow.run(runtime="simulator")


def test_an_idle_partition_is_moved_on_by_tick_records(ray_session, kafka_broker, tmp_path):
    """Data on partition 0 only: without ticks partition 1 would hold the watermark forever."""
    from driftstream.engine.connectors.file_sink import FileSink, read_file_sink

    bs = kafka_broker.bootstrap_servers
    topic = topic_name("idle")
    ensure_topic(bs, topic, 2)
    now = int(time.time() * 1000)
    produce(bs, topic, [(0, now + i, json.dumps(i).encode()) for i in range(50)])
    flow = Flow("ticks")
    flow.source(KafkaSource(topic, bs, tick_interval=0.02)).map(lambda x: x * 2).sink(FileSink(tmp_path, name="out"))
    handle = flow.start(parallelism=1)
    deadline = time.time() + 30
    while time.time() < deadline and len(read_file_sink(tmp_path, "out")) < 50:
        time.sleep(0.05)
    handle.stop(timeout=30)
    assert [v for _, v in read_file_sink(tmp_path, "out")] == [2 * i for i in range(50)]
    c = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest")
    ticks = read_partition(c, TopicPartition(topic, 1), 0)
    c.close()
    assert ticks and all(dict(r.headers).get("driftstream-tick") == TICK_MARK and r.value == b"" for r in ticks)


def test_only_the_engines_own_ticks_are_dropped(kafka_broker):
    """On bc7b6d0 any record with a driftstream-tick header was dropped, whatever it held."""
    from driftstream.engine.connectors.kafka.wire import PartitionWriter

    bs = kafka_broker.bootstrap_servers
    topic = topic_name("tick-like")
    ensure_topic(bs, topic, 1)
    w = PartitionWriter(bs, topic, 0)
    w.write([
        (b'{"n": 1}', [("driftstream-tick", b"1")]),           # a user's record with a header of that name
        (b"", [("driftstream-tick", TICK_MARK)]),             # a tick
        (b"", [("driftstream-tick", b"1")]),                  # a tick written before TICK_MARK
        (b'{"n": 2}', [("driftstream-tick", TICK_MARK)]),     # a value: not a tick
        (b"", [("driftstream-tick", b"yes")]),                # another mark: a record (an empty one: a dead letter)
    ])
    w.close()
    source = KafkaSource(topic, bs, bounded=True)
    reader = source.open(0, 0)
    got: list = []
    try:
        while not reader.done:
            got.extend(reader.read(10))
    finally:
        reader.close()
    assert [m[3] for m, _ in got] == [0, 3, 4]
    assert [v for _, v in got[:2]] == [{"n": 1}, {"n": 2}] and type(got[2][1]).__name__ == "DeadLetter"


def _slow(doc):
    time.sleep(0.002)
    return doc["v"]


def test_status_reports_the_source_lag(ray_session, kafka_broker):
    bs = kafka_broker.bootstrap_servers
    src = topic_name("lag")
    ensure_topic(bs, src, 1)
    n = 600  # 1.2 s of the slow map's work: a dozen status polls or more while it is behind
    produce(bs, src, [(0, 1_000 + i, json.dumps({"v": i}).encode()) for i in range(n)])
    f = Flow(f"lag-{uuid.uuid4().hex[:6]}")
    f.source(KafkaSource(src, bs), name="in").map(_slow, name="slow").sink(MemorySink("out"))
    handle = f.start(parallelism=1, batch_size=32, max_inflight=64)
    try:
        lags = []
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                status = handle.status()
            except Exception:
                time.sleep(0.1)
                continue
            if status.get("source_lag") is not None:
                lags.append(status["source_lag"])
                if lags[-1] == 0 and status["emitted"] == n:
                    break
            time.sleep(0.1)
        assert any(lag > 0 for lag in lags), lags  # behind while the slow map works through the backlog
        assert lags[-1] == 0  # caught up
    finally:
        handle.stop(timeout=60)


def test_a_partition_written_by_two_producers_is_read_without_holes(kafka_broker):
    """Tansu stores a batch after assigning its offsets, so a fetch can see a later producer's
    batch before an earlier one's: the reader must wait for the earlier one, not skip it."""
    import threading

    bs = kafka_broker.bootstrap_servers
    topic = topic_name("two-writers")
    ensure_topic(bs, topic, 1)
    n = 1_500

    def write(tag: str, pad: int) -> None:
        p = KafkaProducer(bootstrap_servers=bs, linger_ms=0, acks=1, max_in_flight_requests_per_connection=1)
        for i in range(n):
            p.send(topic, json.dumps([tag, i, "x" * pad]).encode(), partition=0)
            time.sleep(0.0005)
        p.flush()
        p.close()

    reader = KafkaSource(topic, bs, tick_interval=None).open(0, 0)
    writers = [threading.Thread(target=write, args=(tag, pad)) for tag, pad in (("a", 800), ("b", 0))]
    for w in writers:
        w.start()
    got: list = []
    try:
        deadline = time.time() + 60
        while len(got) < 2 * n and time.time() < deadline:
            got += reader.read(512) or []
            time.sleep(0.001)
    finally:
        for w in writers:
            w.join(timeout=60)
        reader.close()
    offsets = [t[3] for t, _ in got]
    assert offsets == list(range(2 * n)), f"holes skipped: {reader.gaps.skipped}"
    for tag in ("a", "b"):
        assert [v[1] for _, v in got if v[0] == tag] == list(range(n))


def test_a_tick_that_fails_is_logged_and_the_next_one_appended(kafka_broker, caplog):
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("ticks")
    ensure_topic(bs, topic, 1)
    reader = KafkaSource(topic, bs).open(0, 0)
    try:
        reader._tick()
        reader._ticker.writer._conn._sock.shutdown(2)  # as if the broker had dropped the connection
        reader._tick()
        assert reader.ticks_sent == 1 and "a tick was not appended" in caplog.text
        reader._tick()  # a new connection
        assert reader.ticks_sent == 2
        c = KafkaConsumer(bootstrap_servers=bs)
        assert len(read_partition(c, TopicPartition(topic, 0), 0)) == 2
        c.close()
    finally:
        reader.close()


def test_a_far_future_record_does_not_move_its_partitions_time(kafka_broker):
    """A producer's clock a year off: the record is stamped with its partition's time (the
    next record does not confirm the jump), so windows and timers keep theirs; a replay
    from the offset saved while it was held stamps it the same way."""
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("far")
    ensure_topic(bs, topic, 1)
    year = 365 * 86_400_000
    produce(bs, topic, [(0, ts, json.dumps(i).encode()) for i, ts in enumerate([100, 105, 100 + year, 107, 110])])

    def run(start_offsets=None, max_time_jump_s=86_400.0):
        flow = Flow("far")
        flow.source(KafkaSource(topic, bs, bounded=True, start_offsets=start_offsets, max_time_jump_s=max_time_jump_s)).sink(MemorySink("out"))
        return flow.run(runtime="simulator", seed=1).output_with_meta("out")

    full = run()
    assert [(m.ts, v) for m, v in full] == [(100, 0), (105, 1), (105, 2), (107, 3), (110, 4)]
    assert run({0: (2, 105)}) == full[2:]
    assert [m.ts for m, _ in run(max_time_jump_s=None)] == [100, 105] + [100 + year] * 3  # the old rule: moved for good


def test_a_far_future_last_record_on_a_live_partition_is_judged_by_the_next_tick(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = topic_name("far-live")
    ensure_topic(bs, topic, 1)
    now = int(time.time() * 1000)
    produce(bs, topic, [(0, ts, json.dumps(i).encode()) for i, ts in enumerate([now, now + 1, now + 365 * 86_400_000])])
    reader = KafkaSource(topic, bs, tick_interval=0.02).open(0, 0)
    try:
        got, deadline = [], time.time() + 30
        while len(got) < 3 and time.time() < deadline:
            got += reader.read(100)
            if len(got) == 2:
                assert reader.position() == (2, now + 1)  # held: a replay starts at it
            time.sleep(0.01)
        assert [(t[0], v) for t, v in got] == [(now, 0), (now + 1, 1), (now + 1, 2)]
        assert reader.fetch_state()["clamped_times"] == 1 and reader.ticks_sent >= 1
    finally:
        reader.close()


def test_max_time_jump_s_must_be_positive(kafka_broker):
    with pytest.raises(FlowError, match="max_time_jump_s must be a positive"):
        KafkaSource("t", kafka_broker.bootstrap_servers, max_time_jump_s=0)


def test_a_reader_with_the_logs_tail_in_hand_does_not_poll_the_broker(kafka_broker, monkeypatch):
    """Once the fetcher has read to the log's end, it waits for the reader to hand out what
    it holds before it asks the broker again: in a backlog, long polls every few ms cost
    the source and the broker CPU for the rest of the run. New records still come."""
    from driftstream.engine.connectors.kafka import wire

    bs = kafka_broker.bootstrap_servers
    topic = topic_name("tail")
    ensure_topic(bs, topic, 1)
    produce(bs, topic, [(0, 1000 + i, json.dumps(i).encode()) for i in range(2000)])
    fetches = []
    fetch = wire.TopicFetcher.fetch_answers
    monkeypatch.setattr(wire.TopicFetcher, "fetch_answers", lambda self, *a, **k: fetches.append(1) or fetch(self, *a, **k))
    src = KafkaSource(topic, bs, tick_interval=None)
    src.step_name = "tail"
    part = src.open(0, source_id=0)
    try:
        got = []
        while len(got) < 2000:  # 50 records every 10 ms: the whole log is fetched long before
            got += part.read(50)
            time.sleep(0.01)
        assert [v for _, v in got] == list(range(2000))
        assert len(fetches) <= 10  # a few reads of the log and its end (it was ~60 over these 0.4 s)
        produce(bs, topic, [(0, 5000, b"2000")])
        deadline = time.time() + 10
        while not (more := part.read(50)) and time.time() < deadline:
            time.sleep(0.01)
        assert [v for _, v in more] == [2000]
    finally:
        part.close()
