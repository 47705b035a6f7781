"""The data plane: per-connection FIFO, and peers without the run's token are never unpickled."""

from __future__ import annotations

import asyncio
import pickle
import struct

from driftstream.engine.runtime.transport import Endpoint


class Boom:
    """Unpickling this would record that a stranger's bytes were unpickled."""

    unpickled = False

    def __reduce__(self):
        return (_mark, ())


def _mark():
    Boom.unpickled = True
    return "boom"


def test_messages_arrive_in_order_per_peer():
    async def scenario():
        got = []
        server = Endpoint(b"t" * 32, got.append)
        addr = await server.listen("127.0.0.1")
        a, b = Endpoint(b"t" * 32, None), Endpoint(b"t" * 32, None)
        await a.connect("s", addr)
        await b.connect("s", addr)
        for i in range(500):
            a.send("s", ("a", i))
            b.send("s", ("b", i))
        for _ in range(100):
            if len(got) == 1000:
                break
            await asyncio.sleep(0.01)
        await a.close(), await b.close(), await server.close()
        return got

    got = asyncio.run(scenario())
    assert [i for src, i in got if src == "a"] == list(range(500))
    assert [i for src, i in got if src == "b"] == list(range(500))


def test_a_peer_without_the_token_is_dropped_before_unpickling():
    async def scenario():
        got = []
        server = Endpoint(b"right-token", got.append)
        host, port = await server.listen("127.0.0.1")
        reader, writer = await asyncio.open_connection(host, port)
        wrong = b"wrong-token"
        payload = pickle.dumps(Boom())
        writer.write(struct.pack("!I", len(wrong)) + wrong + struct.pack("!I", len(payload)) + payload)
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(), timeout=5)  # the server hangs up
        await server.close()
        return got, closed

    got, closed = asyncio.run(scenario())
    assert got == [] and closed == b""
    assert not Boom.unpickled
