"""Proxies in front of a broker. :class:`BrokerProxy`, for outage tests: it forwards, refuses
connections (nothing listens), or stalls them (accepts, forwards nothing), and cuts the
connections it holds whenever its mode changes, as a broker that goes away and comes back
does. :class:`SecuredProxy`: a TLS and SASL (SCRAM) listener for a broker without them, on
:class:`LoopProxy`, the asyncio relay that other proxies of the tests build on too."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import socket
import ssl
import struct
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


class LoopProxy:
    """A listener on ``port`` (a free one by default) whose connections one asyncio loop in a
    thread relays to ``127.0.0.1:target``; a subclass says how, in :meth:`relay`. ``close()``
    stops the listener and ends the relays.

    >>> import socket
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = LoopProxy(echo.getsockname()[1])
    >>> proxy.port > 0
    True
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, port: Optional[int] = None, server_context: Optional[ssl.SSLContext] = None) -> None:
        self.target = target
        self.port = port or _free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server_context,), daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError(f"the proxy did not listen on port {self.port}")

    def _run(self, server_context: Optional[ssl.SSLContext]) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(
            self._serve, "127.0.0.1", self.port, ssl=server_context, ssl_handshake_timeout=5 if server_context else None))
        # A client that does not speak TLS, or does not trust the certificate, fails its
        # handshake, and connections are cut at close: what the tests want, no tracebacks.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._started.set()
        self._loop.run_forever()
        # Stopped by close(): end the connections' relays while the loop can still run them.
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
        await self.relay(reader, writer, up_reader, up_writer)

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        """Relay one client connection and its upstream one: by default every byte, both ways."""
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=10)


class SecuredProxy(LoopProxy):
    """A TLS and/or SASL listener on ``port`` (a free one by default) in front of the broker at
    ``127.0.0.1:target``, which has neither: Tansu 0.6.0's own TLS cannot be switched on (its
    ``--cert`` and ``--key`` exclude each other), and with ``--authentication`` it admits no
    one on its in-memory storage (it creates SCRAM users only for an authenticated client).

    ``server_context``: TLS with it (None: plain TCP). ``scram_users``: ``{user: password}``;
    a client must then authenticate with SCRAM-SHA-256 or -512 (SaslHandshake v1,
    SaslAuthenticate) before anything but ApiVersions is forwarded, and is told
    ``session_lifetime_ms`` (0: no limit), after which its connection is cut, as a broker
    with ``connections.max.reauth.ms`` does. Counts ``authentications``, ``refused`` and
    connections ``cut`` at the end of their session.

    One asyncio loop in a thread serves every connection (an ``SSLSocket`` may not be read
    and written from two threads at once).

    >>> import socket, ssl
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = SecuredProxy(echo.getsockname()[1], ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    >>> proxy.port > 0
    True
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, server_context: Optional[ssl.SSLContext] = None, port: Optional[int] = None,
                 scram_users: Optional[dict] = None, session_lifetime_ms: int = 0) -> None:
        self.scram_users = scram_users
        self.session_lifetime_ms = session_lifetime_ms
        self.authentications = self.refused = self.cut = 0
        super().__init__(target, port, server_context)

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        try:
            if self.scram_users is not None and not await self._authenticate(reader, writer, up_reader, up_writer):
                return
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, IndexError):  # gone, or not Kafka
            writer.close()
            up_writer.close()
            return
        if self.scram_users is not None and self.session_lifetime_ms:
            self._loop.call_later(self.session_lifetime_ms / 1000.0, self._cut, writer, up_writer)
        await super().relay(reader, writer, up_reader, up_writer)

    def _cut(self, writer: asyncio.StreamWriter, up_writer: asyncio.StreamWriter) -> None:
        if not writer.is_closing():
            self.cut += 1
            writer.close()
            up_writer.close()

    async def _authenticate(self, reader, writer, up_reader, up_writer) -> bool:
        """Serve ApiVersions (from the broker), SaslHandshake and SaslAuthenticate until the
        client is in (True) or refused (False: its connection is closed)."""
        from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse

        scram = None
        while True:
            size = await reader.readexactly(4)
            frame = await reader.readexactly(int.from_bytes(size, "big"))
            api_key, version, correlation_id = struct.unpack(">hhi", frame[:8])
            if api_key == 18:  # ApiVersions: the broker's answer
                up_writer.write(size + frame)
                answer_size = await up_reader.readexactly(4)
                writer.write(answer_size + await up_reader.readexactly(int.from_bytes(answer_size, "big")))
                continue
            if api_key == 17:
                mechanism = SaslHandshakeRequest.decode(frame, version=version, header=True).mechanism
                known = mechanism in ScramServer.HASHES
                self.refused += not known  # counted before the answer, which the client may act on at once
                _answer(writer, SaslHandshakeResponse(error_code=0 if known else 33, mechanisms=list(ScramServer.HASHES)), version, correlation_id)
                if not known:
                    break
                scram = ScramServer(self.scram_users, mechanism)
                continue
            if api_key != 36 or scram is None:
                self.refused += 1
                break  # anything else before authentication: hang up, as Kafka does
            token = bytes(SaslAuthenticateRequest.decode(frame, version=version, header=True).auth_bytes)
            reply, done, ok = scram.step(token)
            if done and not ok:
                self.refused += 1
                _answer(writer, SaslAuthenticateResponse(
                    error_code=58, error_message=f"Authentication failed during authentication due to invalid credentials with SASL mechanism {scram.mechanism}",
                    auth_bytes=b"", session_lifetime_ms=0), version, correlation_id)
                break
            _answer(writer, SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=reply,
                                                     session_lifetime_ms=self.session_lifetime_ms if done else 0), version, correlation_id)
            if done:
                self.authentications += 1
                return True
        await writer.drain()
        writer.close()
        up_writer.close()
        return False

def _answer(writer: asyncio.StreamWriter, response, version: int, correlation_id: int) -> None:
    response.API_VERSION = version
    response.with_header(correlation_id=correlation_id)
    writer.write(bytes(response.encode(header=True, framed=True)))


class ScramServer:
    """The server side of one SCRAM exchange (RFC 5802, 7677) for ``users`` (``{name: password}``).

    ``step(token)`` takes the client's message and returns ``(reply, done, accepted)``.
    """

    HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
    ITERATIONS = 4096

    def __init__(self, users: dict, mechanism: str) -> None:
        self.users = users
        self.mechanism = mechanism
        self.hash = self.HASHES[mechanism]
        self._expect_final = False

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def step(self, token: bytes) -> tuple:
        if not self._expect_final:  # client-first: "n,,n=user,r=nonce"
            self.first_bare = token.split(b",", 2)[2]
            attrs = dict(kv.split(b"=", 1) for kv in self.first_bare.split(b","))
            password = self.users.get(attrs[b"n"].decode())
            if password is None:
                return b"", True, False
            salt = os.urandom(16)
            salted = hashlib.pbkdf2_hmac(self.hash, password.encode(), salt, self.ITERATIONS)
            self.stored_key = hashlib.new(self.hash, self._hmac(salted, b"Client Key")).digest()
            self.server_key = self._hmac(salted, b"Server Key")
            nonce = attrs[b"r"] + base64.b64encode(os.urandom(18))
            self.server_first = b"r=" + nonce + b",s=" + base64.b64encode(salt) + b",i=" + str(self.ITERATIONS).encode()
            self._expect_final = True
            return self.server_first, False, True
        without_proof, _, proof = token.rpartition(b",p=")  # client-final
        auth_message = self.first_bare + b"," + self.server_first + b"," + without_proof
        signature = self._hmac(self.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature))
        if hashlib.new(self.hash, client_key).digest() != self.stored_key:
            return b"", True, False
        return b"v=" + base64.b64encode(self._hmac(self.server_key, auth_message)), True, True


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    finally:
        writer.close()
