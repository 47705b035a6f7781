"""The data plane's handshake: both ends prove they hold the run's secret, which never crosses the wire.

A connection opens with a mutual challenge-response (HMAC-SHA256 over fresh nonces,
as in CRAM schemes): the listener sends ``HELLO`` and a 32-byte nonce; the connecting
side answers with its own nonce, its name and ``mac(secret, "client", both nonces,
name)``; the listener checks it, then proves itself with ``mac(secret, "server", both
nonces)``, which the connecting side checks before it sends anything. A recorded
handshake is worth nothing on another connection (the listener's nonce is new), and
someone who reads every byte learns no more than MACs. Until the proof checks, the
listener reads fixed-size fields only (the name at most ``MAX_NAME`` bytes) and never
unpickles anything; a peer that says nothing is dropped after ``TIMEOUT_S`` (with TLS,
the TLS handshake before it is held to the same timeout, see :mod:`.transport`).

Cost: one extra round trip and three HMACs per connection, paid once per pair of
actors at launch (not per message).

>>> import asyncio
>>> async def demo(server_secret: bytes, client_secret: bytes):
...     async def serve(reader, writer):
...         got.append(await accept(reader, writer, server_secret))
...         writer.close()
...     got = []
...     server = await asyncio.start_server(serve, "127.0.0.1", 0)
...     reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
...     try:
...         await offer(reader, writer, client_secret, "stage/0")
...     except HandshakeError as exc:
...         got.append(str(exc))
...     writer.close(); server.close()
...     await asyncio.sleep(0.01)
...     return got
>>> asyncio.run(demo(b"s" * 32, b"s" * 32))
['stage/0']
>>> sorted(asyncio.run(demo(b"s" * 32, b"x" * 32)), key=str)
[None, 'the data-plane peer did not answer the handshake']
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import struct
from typing import Optional

HELLO = b"DSP1"  # protocol and version: a listener of another version is told apart at once
NONCE = 32
MAC = hashlib.sha256().digest_size
MAX_NAME = 1024
TIMEOUT_S = 5.0
_LEN = struct.Struct("!H")


class HandshakeError(ConnectionError):
    """The other end did not prove it holds the run's secret (or spoke another protocol)."""


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join((role, *parts)), hashlib.sha256).digest()


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes,
                 timeout: Optional[float] = None) -> Optional[str]:
    """The listening side. Returns the peer's name, or None (after closing nothing: the
    caller closes) if it did not prove the secret within ``timeout`` seconds."""
    ours = secrets.token_bytes(NONCE)
    writer.write(HELLO + ours)
    try:
        theirs, proof, name = await asyncio.wait_for(_read_offer(reader), TIMEOUT_S if timeout is None else timeout)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
        return None
    if not hmac.compare_digest(proof, _mac(secret, b"client", ours, theirs, name)):
        return None
    writer.write(_mac(secret, b"server", ours, theirs))
    try:
        return name.decode()
    except UnicodeDecodeError:
        return None


async def _read_offer(reader: asyncio.StreamReader) -> tuple:
    theirs = await reader.readexactly(NONCE)
    proof = await reader.readexactly(MAC)
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_NAME:
        raise ValueError("name too long")
    return theirs, proof, await reader.readexactly(n)


async def offer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, name: str,
                timeout: Optional[float] = None) -> None:
    """The connecting side: answer the listener's challenge as ``name`` and check its
    proof. HandshakeError if it is not a listener of this run."""
    try:
        await asyncio.wait_for(_offer(reader, writer, secret, name.encode()), TIMEOUT_S if timeout is None else timeout)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
        if isinstance(exc, HandshakeError):
            raise
        raise HandshakeError("the data-plane peer did not answer the handshake") from exc


async def _offer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, name: bytes) -> None:
    hello = await reader.readexactly(len(HELLO) + NONCE)
    if hello[:len(HELLO)] != HELLO:
        raise HandshakeError(f"the data-plane peer speaks another protocol ({hello[:len(HELLO)]!r})")
    theirs, ours = hello[len(HELLO):], secrets.token_bytes(NONCE)
    writer.write(ours + _mac(secret, b"client", theirs, ours, name) + _LEN.pack(len(name)) + name)
    proof = await reader.readexactly(MAC)
    if not hmac.compare_digest(proof, _mac(secret, b"server", theirs, ours)):
        raise HandshakeError("the data-plane peer does not hold this run's secret")
