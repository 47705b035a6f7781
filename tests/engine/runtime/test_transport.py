"""The data plane: per-connection FIFO; a peer that does not prove the run's secret (junk,
a wrong secret, a replayed handshake, silence) is closed with nothing of it unpickled;
the secret never crosses the wire; frames over the limit and frames that cannot be
loaded are reported, not swallowed."""

from __future__ import annotations

import asyncio
import pickle
import struct

import pytest

from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.runtime import handshake, transport
from driftstream.engine.runtime.handshake import HandshakeError
from driftstream.engine.runtime.transport import Endpoint, FrameTooLarge

KEY = PlaneKey(b"t" * 32)


class Boom:
    """Unpickling this would record that a stranger's bytes were unpickled."""

    unpickled = False

    def __reduce__(self):
        return (_mark, ())


def _mark():
    Boom.unpickled = True
    return "boom"


class Unloadable:
    """Pickles fine, fails when loaded: an engine fault on the receiving side."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise KeyError("no such stage")


async def _eventually(cond, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)


def test_messages_arrive_in_order_per_peer():
    async def scenario():
        got = []
        server = Endpoint(KEY, got.append)
        addr = await server.listen("127.0.0.1")
        a, b = Endpoint(KEY, None, me="a"), Endpoint(KEY, None, me="b")
        await a.connect("s", addr)
        await b.connect("s", addr)
        for i in range(500):
            a.send("s", ("a", i))
            b.send("s", ("b", i))
        await _eventually(lambda: len(got) == 1000)
        await a.close(), await b.close(), await server.close()
        return got

    got = asyncio.run(scenario())
    assert [i for src, i in got if src == "a"] == list(range(500))
    assert [i for src, i in got if src == "b"] == list(range(500))


class Wire:
    """A raw socket to a listening endpoint, and everything the endpoint sent on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: tuple) -> None:
        self.reader, self.writer, self.address = reader, writer, address

    @classmethod
    async def open(cls, address: tuple) -> "Wire":
        return cls(*await asyncio.open_connection(*address), address)

    async def hello(self) -> bytes:
        """The listener's challenge: HELLO and its nonce."""
        return await asyncio.wait_for(self.reader.readexactly(len(handshake.HELLO) + handshake.NONCE), 5)

    async def closed_by_peer(self, seconds: float = 10) -> bytes:
        """What the listener sent until it hung up (b"" if nothing more)."""
        return await asyncio.wait_for(self.reader.read(), seconds)


def refused(scenario) -> tuple:
    """Run ``scenario(wire)`` against an endpoint; (what it received, what it sent back after
    the challenge, its refusals count)."""

    async def run():
        got = []
        server = Endpoint(KEY, got.append)
        addr = await server.listen("127.0.0.1")
        wire = await Wire.open(addr)
        try:
            answer = await scenario(wire)
        finally:
            wire.writer.close()
        await _eventually(lambda: server.refused == 1, 1.0)
        await server.close()
        return got, answer, server.refused

    Boom.unpickled = False
    got, answer, count = asyncio.run(run())
    assert not Boom.unpickled
    return got, answer, count


def test_junk_is_closed_and_never_unpickled():
    async def junk(wire: Wire) -> bytes:
        await wire.hello()
        payload = pickle.dumps(Boom())
        wire.writer.write(struct.pack("!I", len(payload)) + payload + b"\x00" * 200)
        return await wire.closed_by_peer()

    assert refused(junk) == ([], b"", 1)


def test_a_wrong_secret_is_closed_and_never_unpickled():
    async def wrong(wire: Wire) -> bytes:
        try:  # a full handshake with another secret: the listener does not prove itself back
            await handshake._offer(wire.reader, wire.writer, b"w" * 32, b"intruder")
        except asyncio.IncompleteReadError:
            payload = pickle.dumps(Boom())  # and frames sent anyway go nowhere
            wire.writer.write(struct.pack("!I", len(payload)) + payload)
            return b"closed"
        return b"proved"

    assert refused(wrong) == ([], b"closed", 1)


def test_a_replayed_handshake_is_closed():
    # Record a good client's bytes on one connection, then replay them on another: the
    # listener's nonce is new, so the recorded proof does not check.
    recorded = bytearray()

    async def replayed(wire: Wire) -> bytes:
        reader, writer = await asyncio.open_connection(*wire.address)
        real_write = writer.write

        def tap(data: bytes) -> None:
            recorded.extend(data)
            real_write(data)

        writer.write = tap
        await handshake.offer(reader, writer, KEY.secret, "stage/0")
        payload = pickle.dumps(("hello", 1))
        writer.write(struct.pack("!I", len(payload)) + payload)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await wire.hello()
        boom = pickle.dumps(Boom())
        wire.writer.write(bytes(recorded) + struct.pack("!I", len(boom)) + boom)
        return await wire.closed_by_peer()

    assert refused(replayed) == ([("hello", 1)], b"", 1)
    assert KEY.secret not in recorded  # what crossed the wire holds MACs and nonces, not the secret


def test_a_silent_peer_is_closed_after_the_handshake_timeout(monkeypatch):
    monkeypatch.setattr(handshake, "TIMEOUT_S", 0.3)

    async def silent(wire: Wire) -> bytes:
        await wire.hello()
        return await wire.closed_by_peer(seconds=5)  # says nothing; the listener hangs up

    async def timed(wire):
        loop = asyncio.get_running_loop()
        began = loop.time()
        answer = await silent(wire)
        return answer, loop.time() - began

    got, (answer, took), count = refused(timed)
    assert got == [] and answer == b"" and count == 1
    assert took < 3


def test_connecting_to_a_listener_of_another_run_fails_before_sending():
    async def run():
        got = []
        server = Endpoint(PlaneKey.new(), got.append)
        addr = await server.listen("127.0.0.1")
        client = Endpoint(KEY, None, me="a")
        with pytest.raises(HandshakeError):
            await client.connect("s", addr)
        await server.close()
        return got

    assert asyncio.run(run()) == []


def test_frames_over_the_limit_are_refused_on_both_sides():
    async def run():
        got, errors = [], []
        server = Endpoint(KEY, got.append, on_error=lambda peer, exc: errors.append((peer, str(exc))), max_frame=1_000)
        addr = await server.listen("127.0.0.1")
        client = Endpoint(KEY, None, me="big", max_frame=10_000)
        await client.connect("s", addr)
        with pytest.raises(FrameTooLarge, match="big made a bytes for s of 20,0.. bytes, over the data plane's frame limit of 10,000: lower batch_size"):
            client.send("s", b"x" * 20_000)
        client.send("s", b"x" * 5_000)  # within the sender's limit, over the listener's
        await _eventually(lambda: errors)
        await client.close(), await server.close()
        return got, errors

    got, errors = asyncio.run(run())
    assert got == []
    assert errors and errors[0][0] == "big" and "over the limit of 1,000" in errors[0][1]


def test_a_frame_that_cannot_be_loaded_is_reported_with_its_peer():
    async def run():
        got, errors = [], []
        server = Endpoint(KEY, got.append, on_error=lambda peer, exc: errors.append((peer, exc)))
        addr = await server.listen("127.0.0.1")
        client = Endpoint(KEY, None, me="stage/1")
        await client.connect("s", addr)
        client.send("s", ("before", 0))
        client.send("s", Unloadable())
        await _eventually(lambda: errors)
        await client.close(), await server.close()
        return got, errors

    got, errors = asyncio.run(run())
    assert got == [("before", 0)]
    assert [(peer, type(exc)) for peer, exc in errors] == [("stage/1", KeyError)]


# -- TLS --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    from tests.tls_files import make_tls

    base = tmp_path_factory.mktemp("tls")
    return make_tls(base / "run", "run"), make_tls(base / "other", "other")


def test_tls_endpoints_talk_and_a_plain_or_foreign_peer_does_not(tls_pair):
    ours, foreign = tls_pair
    key = PlaneKey(b"t" * 32, ours)

    async def run():
        got = []
        server = Endpoint(key, got.append)
        addr = await server.listen("127.0.0.1")
        client = Endpoint(key, None, me="a")
        await client.connect("s", addr)
        client.send("s", ("over tls", 1))
        await _eventually(lambda: got)
        # A plain TCP peer with the right secret: the TLS handshake fails, nothing is loaded. The
        # TLS server leaves its hello unanswered until the 5 s handshake timeout: 2 s of that
        # without a connection make the claim.
        with pytest.raises((HandshakeError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError)):
            await asyncio.wait_for(Endpoint(PlaneKey(key.secret), None).connect("s", addr), 2)
        # A peer whose certificate another CA signed: refused by TLS itself.
        import ssl

        with pytest.raises((ssl.SSLError, ConnectionError, HandshakeError)):
            await asyncio.wait_for(Endpoint(PlaneKey(key.secret, foreign), None).connect("s", addr), 5)
        await client.close(), await server.close()
        return got

    assert asyncio.run(run()) == [("over tls", 1)]


def test_the_frame_limit_takes_a_full_batch_of_kafka_sized_records_and_no_more_than_that():
    # A batch holds batch_size (256) elements; a Kafka record is at most message.max.bytes
    # (1 MiB by default). Anything past that is no batch of this engine's defaults.
    assert 256 * (1 << 20) < transport.MAX_FRAME < 1 << 30


def test_a_silent_peer_under_tls_is_dropped_after_the_handshake_timeout_not_asyncios_60_s(tls_pair, monkeypatch):
    monkeypatch.setattr(handshake, "TIMEOUT_S", 0.5)
    key = PlaneKey(b"t" * 32, tls_pair[0])

    async def run():
        server = Endpoint(key, None)
        addr = await server.listen("127.0.0.1")
        reader, writer = await asyncio.open_connection(*addr)  # plain TCP: never starts the TLS handshake
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            closed = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
            await server.close()
        return closed, loop.time() - began

    closed, took = asyncio.run(run())
    assert closed == b"" and took < 5  # asyncio's own TLS handshake timeout is 60 s
