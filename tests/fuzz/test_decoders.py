"""Fuzzing: hypothesis-made bytes into every decoder that reads bytes from outside a
process (the snapshot codec and deltas, a fetched Kafka partition's record batches, a
Kafka value, the data plane's handshake). None may crash with anything but its own
clear error, or hang."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driftstream.engine.connectors.kafka import wire
from driftstream.engine.connectors.kafka.codecs import MissingCodec
from driftstream.engine.connectors.kafka.source import _json
from driftstream.engine.runtime import handshake
from driftstream.snapshots import changelog, codec

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mutated(valid: bytes) -> st.SearchStrategy:
    """``valid`` truncated, with bytes flipped, or with bytes inserted."""
    n = len(valid)
    return st.one_of(
        st.integers(0, max(0, n - 1)).map(lambda k: valid[:k]),
        st.lists(st.tuples(st.integers(0, max(0, n - 1)), st.integers(1, 255)), min_size=1, max_size=4).map(
            lambda flips: bytes(b ^ dict(flips).get(i, 0) for i, b in enumerate(valid))),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=8)).map(lambda a: valid[:a[0]] + a[1] + valid[a[0]:]),
    )


VALUE = {"k": [1, 2.5, "x", None, True], 7: (b"raw", {"nested": [3]})}


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated(codec.encode(VALUE))))
def test_the_snapshot_codec_raises_decode_error_only(data):
    try:
        codec.decode(data)
    except codec.DecodeError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_a_delta_raises_a_value_error_only(data):
    try:
        changelog.decode_delta(data)
    except ValueError:  # DecodeError is one
        pass


def _valid_batch() -> bytes:
    builder = next(wire.record_batches([(b'{"n": %d}' % i, [("h", b"v")]) for i in range(5)]))
    return bytes(builder.buffer())


@FUZZ
@given(st.one_of(st.binary(max_size=400), mutated(_valid_batch())))
def test_a_fetched_partition_raises_a_corrupt_fetch_only(data):
    try:
        for batch in wire.batches_from(data, 0, where="t[0]"):
            list(batch.records)
    except (wire.CorruptFetch, MissingCodec) as exc:  # MissingCodec: a flipped bit names a codec not installed here
        assert "t[0]" in str(exc)


@FUZZ
@given(st.binary(max_size=200))
def test_a_kafka_json_value_raises_a_value_error_only(data):
    try:
        _json(data)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors: a dead letter
        pass


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_the_handshake_refuses_any_bytes(data):
    async def run():
        got = []

        async def serve(reader, writer):
            got.append(await handshake.accept(reader, writer, b"s" * 32, timeout=0.2))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        try:
            await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            server.close()
        return got

    assert asyncio.run(run()) == [None]
