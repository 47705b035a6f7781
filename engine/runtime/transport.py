"""The data plane: framed messages over asyncio TCP between the actors of one run.

Ray starts, places, names and kills the actors; batches, acks and watermarks
travel on plain TCP connections between them. On a 2-core VM a Ray actor call
costs 1-1.6 ms of receiver CPU and 2-5 ms of latency under load, a framed
message on a socket ~0.15 ms and 0.2 ms (see the issue notes for the
measurements); the engine sends several messages per input element, so this is
the difference between meeting a 10 ms latency floor and missing it by 3x.

Every connection starts with a challenge-response on the run's secret
(:mod:`.handshake`; TLS as well with the key's ``tls``): a peer that does not
prove it holds the secret within a few seconds is dropped before anything it
sent is unpickled. Messages are pickled because both ends are this engine's own
actors of one run. The handshake names the peer, so that a connection that ends
while the endpoint is open (the peer's process died, with its node or alone)
names the peer lost (``on_lost``): seen at once, without waiting for Ray's
health check. A frame that cannot be loaded or handled is an engine fault:
``on_error(peer, exc)`` hears it (the actors fail the run with it).

>>> import asyncio
>>> from driftstream.engine.model.data_plane import PlaneKey
>>> async def demo():
...     got, key = [], PlaneKey.new()
...     server = Endpoint(key, got.append)
...     addr = await server.listen("127.0.0.1")
...     client = Endpoint(key, None)
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
import logging
import pickle
import struct
from typing import Any, Callable, Optional

from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.runtime import handshake
from driftstream.engine.runtime.handshake import accept, offer

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
#: The largest frame an endpoint sends or takes. The largest legitimate frame is a batch:
#: batches are flushed by count (``batch_size``, 256 elements by default), and an element is
#: as large as its source lets it be, a Kafka record at most ``message.max.bytes`` (1 MiB by
#: default): 256 MiB, with room here for their metas and pickling. Snapshot messages carry
#: file references and positions only (kilobytes). A frame is read whole into memory, so
#: anything larger is refused by name rather than allocated.
MAX_FRAME = 320 * 1024 * 1024


class FrameTooLarge(ValueError):
    """A message pickles to more than the endpoint's ``max_frame`` bytes."""


def _tls_timeout(tls: object) -> Optional[float]:
    """asyncio's TLS handshake timeout (60 s by default) cut to the data plane's handshake
    timeout: a peer that opens a connection and says nothing is dropped as fast with TLS as
    without. None without TLS (asyncio refuses the argument there)."""
    return None if tls is None else handshake.TIMEOUT_S


class Endpoint:
    """One actor's side of the data plane: a listening socket and connections to peers.

    ``handler(message)`` runs in the event loop for every message received, in
    the order each peer sent them (TCP keeps per-connection FIFO).
    """

    def __init__(self, key: PlaneKey, handler: Optional[Callable[[Any], None]], me: str = "",
                 on_lost: Optional[Callable[[str], None]] = None,
                 on_error: Optional[Callable[[str, BaseException], None]] = None, max_frame: int = MAX_FRAME) -> None:
        self.key = key
        self.handler = handler
        self.me = me
        self.on_lost = on_lost
        self.on_error = on_error
        self.max_frame = max_frame
        self.server: Optional[asyncio.AbstractServer] = None
        self.writers: dict = {}
        self.closed = False
        self.sent = 0
        self.received = 0
        self.refused = 0  # connections that did not prove the secret

    async def listen(self, host: str) -> tuple:
        """Listen on an ephemeral port of ``host``; returns ``(host, port)`` for peers.
        FlowError first if this node cannot derive the run's secret (its key file)."""
        self.key.secret  # noqa: B018  (derived here, where an error reaches the launch as a call's error)
        tls = self.key.tls.server_context() if self.key.tls is not None else None
        self.server = await asyncio.start_server(self._serve, host, 0, ssl=tls, ssl_handshake_timeout=_tls_timeout(tls))
        return self.server.sockets[0].getsockname()[:2]

    async def connect(self, name: Any, address: tuple) -> None:
        """Open the connection used by ``send(name, ...)``, once the peer proved it is of
        this run (HandshakeError if not)."""
        tls = self.key.tls.client_context() if self.key.tls is not None else None
        reader, writer = await asyncio.open_connection(*address, ssl=tls, ssl_handshake_timeout=_tls_timeout(tls))
        try:
            await offer(reader, writer, self.key.secret, self.me)
        except BaseException:
            writer.close()
            raise
        self.writers[name] = writer

    def adopt(self, name: Any, opened: Any) -> None:
        """The connection opened as ``opened`` now serves ``name`` (``recovery="local"``: a failed
        peer's replacement), the old one closed."""
        old = self.writers.get(name)
        if old is not None:
            old.close()
        self.writers[name] = self.writers.pop(opened)

    def send(self, name: Any, message: Any) -> None:
        """Queue ``message`` for peer ``name``; never blocks (sources' credit bounds what is queued).

        After ``close()`` messages are dropped: they belong to an incarnation that is gone.
        """
        writer = self.writers[name] if not self.closed else None
        if writer is None or writer.transport.is_closing():
            return  # the peer is gone; the supervisor is about to restart this incarnation
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > self.max_frame:
            raise FrameTooLarge(f"data plane: {self.me or 'an actor'} made a {type(message).__name__} for {name} of {len(data):,} bytes, "
                                f"over the data plane's frame limit of {self.max_frame:,}: lower batch_size (a batch holds up to "
                                "batch_size elements of one step's output) or make the elements smaller")
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
            peer = await accept(reader, writer, self.key.secret)
            if peer is None:
                self.refused += 1
                log.warning("data plane: refused a connection from %s that did not prove the run's secret",
                            writer.get_extra_info("peername"))
                return  # not one of ours: never unpickle what it sends
            await self._read_frames(reader, peer)
        except (asyncio.IncompleteReadError, ConnectionError):
            if peer and not self.closed and self.on_lost is not None:
                self.on_lost(peer)  # the peer's end closed while this incarnation runs: it died
        except asyncio.CancelledError:
            # The loop is shutting down. Ending normally (not cancelled) keeps
            # Python 3.11's stream callback from logging a spurious traceback.
            pass
        finally:
            writer.close()

    async def _read_frames(self, reader: asyncio.StreamReader, peer: str) -> None:
        handler, loads, unpack, readexactly = self.handler, pickle.loads, _LEN.unpack, reader.readexactly
        while True:
            (n,) = unpack(await readexactly(4))
            if n > self.max_frame:
                self._error(peer, FrameTooLarge(f"a frame of {n:,} bytes from {peer}, over the limit of {self.max_frame:,}"))
                return
            data = await readexactly(n)
            if self.closed:
                return  # a message for an incarnation that has been reset
            self.received += 1
            try:
                handler(loads(data))
            except Exception as exc:  # an engine fault: the run must hear of it, not lose the message quietly
                self._error(peer, exc)
                return

    def _error(self, peer: str, exc: BaseException) -> None:
        log.error("data plane: a message from %s could not be loaded or handled: %r", peer, exc, exc_info=exc)
        if self.on_error is not None and not self.closed:
            self.on_error(peer, exc)
