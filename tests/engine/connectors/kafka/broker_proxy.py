"""Proxies in front of a broker. :class:`BrokerProxy`, for outage tests: it forwards, refuses
connections (nothing listens), or stalls them (accepts, forwards nothing), and cuts the
connections it holds whenever its mode changes, as a broker that goes away and comes back
does. :class:`TlsProxy`: a TLS listener for a broker without one."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from typing import Optional


class BrokerProxy:
    """Listens on ``port`` (a free one by default) and forwards to ``127.0.0.1:target``.

    >>> import socket
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = BrokerProxy(echo.getsockname()[1])
    >>> proxy.refuse()
    >>> try:
    ...     socket.create_connection(("127.0.0.1", proxy.port), timeout=1)
    ... except ConnectionRefusedError:
    ...     print("refused")
    refused
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, port: Optional[int] = None) -> None:
        self.target = target
        self.mode = "forward"
        self._lock = threading.Lock()
        self._conns: list = []
        self._listener: Optional[socket.socket] = None
        self.port = port or _free_port()
        self._listen()

    def forward(self) -> None:
        self._set("forward")

    def refuse(self) -> None:
        self._set("refuse")

    def stall(self) -> None:
        self._set("stall")

    def close(self) -> None:
        self._set("closed")

    def _set(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            conns, self._conns = self._conns, []
        for c in conns:
            _close(c)
        if mode in ("refuse", "closed"):
            self._stop_listening()
        elif self._listener is None:
            self._listen()

    def _listen(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                mode = self.mode
                self._conns.append(client)
            if mode != "forward":
                continue  # stalled: held open, nothing forwarded
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _close(src)
        _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TlsProxy:
    """Terminates TLS on ``port`` (a free one by default) and forwards the plain bytes to
    ``127.0.0.1:target``: a TLS listener in front of a broker that has none (Tansu 0.6.0's
    own TLS cannot be switched on: its ``--cert`` and ``--key`` exclude each other).

    One asyncio loop in a thread does every connection's TLS (an ``SSLSocket`` may not be
    read and written from two threads at once).

    >>> import socket, ssl
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = TlsProxy(echo.getsockname()[1], ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    >>> proxy.port > 0
    True
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, server_context: ssl.SSLContext, port: Optional[int] = None) -> None:
        self.target = target
        self.port = port or _free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server_context,), daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError(f"the TLS proxy did not listen on port {self.port}")

    def _run(self, server_context: ssl.SSLContext) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=server_context, ssl_handshake_timeout=5)
        )
        # A client that does not speak TLS, or does not trust the certificate, fails its
        # handshake: what the tests want, not worth a traceback on stderr.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._started.set()
        self._loop.run_forever()
        # Stopped by close(): end the connections' copies while the loop can still run them.
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=10)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    finally:
        writer.close()
