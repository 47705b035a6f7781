"""One partition over the wire protocol, against a real broker (Tansu): what is written
is fetched back whole and in order, from any offset; errors name the partition; a
broken connection is re-established."""

from __future__ import annotations

import time
import uuid

import kafka.errors as kafka_errors
import pytest
from driftstream.engine.connectors.kafka import wire as kafka_wire
from driftstream.engine.connectors.kafka.io import ensure_topic, partition_count
from driftstream.engine.connectors.kafka.wire import PartitionWriter, TopicFetcher


def fresh_topic(bs: str, partitions: int = 1) -> str:
    topic = f"wire-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, topic, partitions)
    return topic


def fetch_all(
    fetcher: TopicFetcher, offset: int, count: int, timeout: float = 20.0, partition: int = 0, empty: tuple = ()
) -> list:
    """``count`` records of ``partition`` from ``offset``, over as many fetches as it takes
    (a broker may answer with fewer batches than it holds). Each request also asks for
    the ``empty`` partitions from offset 0, and they must never answer."""
    out: list = []
    deadline = time.time() + timeout
    while len(out) < count and time.time() < deadline:
        answer = fetcher.fetch({**{p: 0 for p in empty}, partition: offset})
        assert not set(answer) & set(empty)
        got = answer.get(partition)
        if got:
            out.extend(got)
            offset = got[-1].offset + 1
    return out


def test_written_records_are_fetched_back_in_order_from_any_offset(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = fresh_topic(bs, 2)
    writer = PartitionWriter(bs, topic, 1)
    fetcher = TopicFetcher(bs, topic, [1])
    try:
        assert writer.write([(b"v%d" % i, [("h", b"%d" % i)]) for i in range(10)]) == 10
        writer.write([(b"", [])])
        got = fetch_all(fetcher, 0, 11, partition=1)
        assert [r.offset for r in got] == list(range(11))
        assert [r.value for r in got[:10]] == [b"v%d" % i for i in range(10)]
        assert got[3].headers == [("h", b"3")]
        assert got[10].value == b""
        assert [r.value for r in fetch_all(fetcher, 7, 4, partition=1)] == [b"v7", b"v8", b"v9", b""]
        assert fetcher.high_watermarks[1] >= 10
        # Both partitions in one request: partition 0 got nothing, so it is left out.
        both = TopicFetcher(bs, topic, [0, 1])
        assert [r.value for r in fetch_all(both, 9, 2, partition=1, empty=(0,))] == [b"v9", b""]
        assert both.fetch({0: 0, 1: 11}) == {}
        both.close()
    finally:
        writer.close()
        fetcher.close()


def test_a_bundle_larger_than_one_request_is_split_and_lands_in_order(kafka_broker, monkeypatch):
    bs = kafka_broker.bootstrap_servers
    topic = fresh_topic(bs)
    monkeypatch.setattr(kafka_wire, "MAX_BATCH_BYTES", 4096)
    sent: list = []
    writer = PartitionWriter(bs, topic, 0)
    real_send = writer._send
    monkeypatch.setattr(writer, "_send", lambda builder: (sent.append(builder.next_offset()), real_send(builder)))
    values = [b"%04d" % i + b"x" * 300 for i in range(100)]
    writer.write((v, []) for v in values)
    assert len(sent) > 5 and sum(sent) == 100
    got = fetch_all(TopicFetcher(bs, topic, [0]), 0, 100)
    assert [r.value for r in got] == values
    writer.close()


def test_locate_finds_the_leader_and_the_versions_without_creating_the_topic(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    leader = kafka_wire.locate(bs, fresh_topic(bs, 2), [0, 1])
    assert f"{leader.host}:{leader.port}" == bs and leader.fetch_version >= 4 and leader.produce_version >= 3
    missing = f"wire-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(kafka_errors.LeaderNotAvailableError, match=missing):
        kafka_wire.locate(bs, missing, [0], timeout_s=0.5)
    assert partition_count(bs, missing, timeout=0.5) == 0  # asking did not create it


def test_a_partition_without_a_leader_is_an_error_that_names_it(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = fresh_topic(bs)
    with pytest.raises(kafka_errors.LeaderNotAvailableError, match=f"{topic}\\[3\\]"):
        TopicFetcher(bs, topic, [3], timeout_s=1.0)


def test_a_broken_connection_is_opened_again(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = fresh_topic(bs)
    writer = PartitionWriter(bs, topic, 0)
    writer.write([(b"a", [])])
    fetcher = TopicFetcher(bs, topic, [0])
    assert [r.value for r in fetch_all(fetcher, 0, 1)] == [b"a"]
    fetcher._conn._sock.shutdown(2)  # as if the broker had dropped it
    assert fetcher.fetch({0: 0}) == {}  # the failed request, then a new connection
    writer._conn._sock.shutdown(2)
    with pytest.raises(kafka_errors.KafkaConnectionError, match=f"{topic}\\[0\\]"):
        writer.write([(b"lost?", [])])  # a write is not retried: it may have landed
    writer.write([(b"b", [])])
    assert [r.value for r in fetch_all(fetcher, 0, 2)][-1] == b"b"
    writer.close()
    fetcher.close()


def test_fetch_wait_grows_while_the_broker_runs_out_of_time_and_shrinks_back():
    """An empty answer although the partition holds more grows the wait (up to the cap);
    answers with records let it shrink back to the floor; the pause keeps a slow broker
    at most half busy and is 0 for a fast one."""
    wait = kafka_wire.FetchWait(floor_ms=5, cap_ms=100)
    for expected in (7, 11, 16, 25, 37, 56, 85, 100, 100):
        wait.observe(took_s=0.005, got_records=False, starved=True)
        assert wait.wait_ms == expected
    assert wait.starved == 9
    wait.observe(took_s=0.005, got_records=False, starved=False)  # idle: caught up, nothing changes
    assert wait.wait_ms == 100
    wait.observe(took_s=0.040, got_records=True, starved=False)
    assert wait.wait_ms == 90 and wait.pause_s == pytest.approx(0.040)
    for _ in range(200):
        wait.observe(took_s=0.002, got_records=True, starved=False)
    assert wait.wait_ms == 5 and wait.pause_s == 0.0 and wait.took_ms == pytest.approx(2.0)


def test_batches_from_gives_the_records_at_the_offset_and_where_the_batch_ends():
    """A batch comes whole (it may start before the offset asked for); it ends past its last
    offset, so a reader knows what the broker has shown it. Headers only: no record."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    for i in range(5):
        builder.append(timestamp=None, key=None, value=b"v%d" % i, headers=[])
    builder.close()
    (batch,) = kafka_wire.batches_from(bytes(builder.buffer()), 3)
    assert [r.value for r in batch.records] == [b"v3", b"v4"] and (batch.offset, batch.next_offset) == (3, 5)
    (header,) = kafka_wire.batches_from(bytes(builder.buffer()), 0, decode=False)
    assert header.records == () and (header.offset, header.next_offset, header.marker) == (0, 5, None)


@pytest.mark.parametrize("server, expected", [
    ("kafka-0:9093", ("kafka-0", 9093)), (" 10.0.0.7:19092 ", ("10.0.0.7", 19092)), ("broker", ("broker", 9092)),
    ("[::1]:9092", ("::1", 9092)), ("[fe80::1%eth0]:29092", ("fe80::1%eth0", 29092)), ("[2001:db8::5]", ("2001:db8::5", 9092)),
    ("2001:db8::5", ("2001:db8::5", 9092)),
])
def test_bootstrap_servers_split_into_host_and_port_ipv6_included(server, expected):
    assert kafka_wire.split_host_port(server) == expected
    host, port = expected
    assert kafka_wire.split_host_port(kafka_wire.join_host_port(host, port)) == expected


@pytest.mark.parametrize("server", ["[::1", "[::1]9092", "host:port", "host:0", ":9092", "host:70000"])
def test_a_malformed_bootstrap_server_is_refused_by_name(server):
    with pytest.raises(ValueError, match="bootstrap server"):
        kafka_wire.split_host_port(server)


def _answer_with_length(prefix: bytes, family: int, host: str):
    """A listener that reads one request and answers with a bare length ``prefix`` (and
    nothing after it), as a TLS listener read as plaintext does; its address."""
    import socket
    import threading

    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(prefix)
            time.sleep(5)  # hold the connection open: an unbounded read waits here for 352 MB
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def test_a_reply_longer_than_the_bound_fails_at_once_naming_the_broker_even_over_ipv6():
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        port = _answer_with_length(b"\x15\x03\x03\x00", socket.AF_INET6, "::1")  # a TLS alert's first bytes: 352,518,912
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    started = time.monotonic()
    with pytest.raises(kafka_wire.ReplyTooLarge, match=r"Kafka broker \[::1\]:\d+ announced a reply of 352,518,912 bytes"):
        kafka_wire.check_broker(f"[::1]:{port}", timeout_s=3.0)
    assert time.monotonic() - started < 2.0


def test_a_negative_reply_length_is_no_kafka_answer_either():
    import socket

    port = _answer_with_length(b"\xff\xff\xff\xf0", socket.AF_INET, "127.0.0.1")
    with pytest.raises(kafka_wire.ReplyTooLarge, match="outside 0"):
        kafka_wire.check_broker(f"127.0.0.1:{port}", timeout_s=3.0)
