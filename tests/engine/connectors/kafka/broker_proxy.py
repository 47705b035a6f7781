"""A TCP proxy in front of a broker, for outage tests: it forwards, refuses connections
(nothing listens), or stalls them (accepts, forwards nothing), and cuts the connections it
holds whenever its mode changes, as a broker that goes away and comes back does."""

from __future__ import annotations

import socket
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
