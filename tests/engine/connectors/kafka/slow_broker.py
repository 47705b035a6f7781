"""A broker whose fetch answers come late: :class:`FetchDelayProxy` in front of a Tansu that
advertises the proxy's port, so every client connection after the bootstrap one goes
through the proxy too (a proxy in front of the fixture's broker would be bypassed: that
broker's metadata names its own port).

The proxy rewrites nothing: it reads each request's header (api key, correlation id) and
holds back the answers to Fetch requests (api key 1) by ``delay_s``; every other answer,
and every byte, passes as it came.
"""

from __future__ import annotations

import asyncio
import struct
from contextlib import contextmanager
from typing import Iterator

from driftstream.engine.connectors.local_kafka import LocalKafka, free_port, start_local_kafka

from tests.engine.connectors.kafka.broker_proxy import LoopProxy

FETCH = 1


class FetchDelayProxy(LoopProxy):
    """Listens on ``port`` and forwards to ``127.0.0.1:target``, each Fetch answer ``delay_s``
    late (settable at any time; 0: none). Answers on a connection stay in order, as Kafka's
    do: one held back holds back those after it. ``fetches``: Fetch answers delayed so far.

    >>> import socket
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = FetchDelayProxy(echo.getsockname()[1], free_port())
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, port: int, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.fetches = 0
        super().__init__(target, port)

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        fetches: set = set()  # correlation ids of this connection's Fetch requests not answered yet

        async def request(frame: bytes) -> None:
            api_key, _, correlation_id = struct.unpack(">hhi", frame[:8])
            if api_key == FETCH:
                fetches.add(correlation_id)

        async def answer(frame: bytes) -> None:
            correlation_id = int.from_bytes(frame[:4], "big", signed=True)
            if correlation_id in fetches:
                fetches.discard(correlation_id)
                self.fetches += 1
                if self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)

        await asyncio.gather(_frames(reader, up_writer, request), _frames(up_reader, writer, answer))


async def _frames(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_frame) -> None:
    """Copy Kafka's size-prefixed frames from ``reader`` to ``writer``, each after ``on_frame(frame)``."""
    try:
        while True:
            size = await reader.readexactly(4)
            frame = await reader.readexactly(int.from_bytes(size, "big"))
            await on_frame(frame)
            writer.write(size + frame)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@contextmanager
def slow_broker(delay_s: float = 0.0) -> Iterator[tuple]:
    """A Tansu of its own behind a :class:`FetchDelayProxy`: ``(broker, proxy)``. Clients given
    ``broker.bootstrap_servers`` (the proxy's port) go through the proxy throughout; a client
    given ``f"127.0.0.1:{broker.port}"`` bootstraps past it, then is sent to the proxy too."""
    port = free_port()
    broker: LocalKafka = start_local_kafka(advertised_port=port)
    proxy = FetchDelayProxy(broker.port, port, delay_s)
    try:
        yield broker, proxy
    finally:
        proxy.close()
        broker.stop()
