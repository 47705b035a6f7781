"""The data plane: framed messages over asyncio TCP between the actors of one run.

Ray starts, places, names and kills the actors; batches, acks and watermarks
travel on plain TCP connections between them. On a 2-core VM a Ray actor call
costs 1-1.6 ms of receiver CPU and 2-5 ms of latency under load, a framed
message on a socket ~0.15 ms and 0.2 ms (see the issue notes for the
measurements); the engine sends several messages per input element, so this is
the difference between meeting a 10 ms latency floor and missing it by 3x.

Every connection starts with the run's secret token; a peer that does not
present it is dropped before anything it sent is unpickled. Messages are
pickled because both ends are this engine's own actors of one run. Then the
peer says who it is, so that a connection that ends while the endpoint is open
(the peer's process died, with its node or alone) names the peer lost
(``on_lost``): seen at once, without waiting for Ray's health check.

>>> import asyncio
>>> async def demo():
...     got = []
...     server = Endpoint(b"secret", got.append)
...     addr = await server.listen("127.0.0.1")
...     client = Endpoint(b"secret", None)
...     await client.connect("server", addr)
...     client.send("server", ("hello", 1))
...     await asyncio.sleep(0.05)
...     await client.close(); await server.close()
...     return got
>>> asyncio.run(demo())
[('hello', 1)]
"""

from __future__ import annotations

import asyncio
import hmac
import pickle
import struct
from typing import Any, Callable, Optional

_LEN = struct.Struct("!I")


class Endpoint:
    """One actor's side of the data plane: a listening socket and connections to peers.

    ``handler(message)`` runs in the event loop for every message received, in
    the order each peer sent them (TCP keeps per-connection FIFO).
    """

    def __init__(self, token: bytes, handler: Optional[Callable[[Any], None]], me: str = "",
                 on_lost: Optional[Callable[[str], None]] = None) -> None:
        self.token = token
        self.handler = handler
        self.me = me.encode()
        self.on_lost = on_lost
        self.server: Optional[asyncio.AbstractServer] = None
        self.writers: dict = {}
        self.closed = False
        self.sent = 0
        self.received = 0

    async def listen(self, host: str) -> tuple:
        """Listen on an ephemeral port of ``host``; returns ``(host, port)`` for peers."""
        self.server = await asyncio.start_server(self._serve, host, 0)
        return self.server.sockets[0].getsockname()[:2]

    async def connect(self, name: Any, address: tuple) -> None:
        """Open the connection used by ``send(name, ...)``."""
        reader, writer = await asyncio.open_connection(*address)
        writer.write(_LEN.pack(len(self.token)) + self.token + _LEN.pack(len(self.me)) + self.me)
        self.writers[name] = writer

    def send(self, name: Any, message: Any) -> None:
        """Queue ``message`` for peer ``name``; never blocks (sources' credit bounds what is queued).

        After ``close()`` messages are dropped: they belong to an incarnation that is gone.
        """
        writer = self.writers[name] if not self.closed else None
        if writer is None or writer.transport.is_closing():
            return  # the peer is gone; the supervisor is about to restart this incarnation
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        writer.write(_LEN.pack(len(data)) + data)
        self.sent += 1

    async def close(self) -> None:
        self.closed = True
        for w in self.writers.values():
            w.close()
        self.writers = {}
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = None
        try:
            (n,) = _LEN.unpack(await reader.readexactly(4))
            if n != len(self.token) or not hmac.compare_digest(await reader.readexactly(n), self.token):
                return  # not one of ours: never unpickle what it sends
            (n,) = _LEN.unpack(await reader.readexactly(4))
            if n > 1024:
                return
            peer = (await reader.readexactly(n)).decode()
            handler, loads, unpack, readexactly = self.handler, pickle.loads, _LEN.unpack, reader.readexactly
            while True:
                (n,) = unpack(await readexactly(4))
                data = await readexactly(n)
                if self.closed:
                    return  # a message for an incarnation that has been reset
                self.received += 1
                handler(loads(data))
        except (asyncio.IncompleteReadError, ConnectionError):
            if peer and not self.closed and self.on_lost is not None:
                self.on_lost(peer)  # the peer's end closed while this incarnation runs: it died
        except asyncio.CancelledError:
            # The loop is shutting down. Ending normally (not cancelled) keeps
            # Python 3.11's stream callback from logging a spurious traceback.
            pass
        finally:
            writer.close()
