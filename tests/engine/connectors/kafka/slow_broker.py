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
import threading
from contextlib import contextmanager
from typing import Iterator

from driftstream.engine.connectors.local_kafka import LocalKafka, free_port, start_local_kafka

FETCH = 1


class FetchDelayProxy:
    """Listens on ``port`` and forwards to ``127.0.0.1:target``, each Fetch answer ``delay_s``
    late (settable at any time; 0: none). Answers on a connection stay in order, as Kafka's
    do: one held back holds back those after it. ``fetches``: Fetch answers delayed so far.

    >>> import socket
    >>> echo = socket.create_server(("127.0.0.1", 0))
    >>> proxy = FetchDelayProxy(echo.getsockname()[1], free_port())
    >>> proxy.close(); echo.close()
    """

    def __init__(self, target: int, port: int, delay_s: float = 0.0) -> None:
        self.target, self.port, self.delay_s = target, port, delay_s
        self.fetches = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError(f"the fetch-delay proxy did not listen on port {port}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._loop.set_exception_handler(lambda loop, context: None)  # connections cut at close: no tracebacks
        self._started.set()
        self._loop.run_forever()
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
        fetches: set = set()  # correlation ids of this connection's Fetch requests not answered yet
        await asyncio.gather(self._requests(reader, up_writer, fetches), self._answers(up_reader, writer, fetches))

    async def _requests(self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, fetches: set) -> None:
        try:
            while True:
                size = await reader.readexactly(4)
                frame = await reader.readexactly(int.from_bytes(size, "big"))
                api_key, _, correlation_id = struct.unpack(">hhi", frame[:8])
                if api_key == FETCH:
                    fetches.add(correlation_id)
                up_writer.write(size + frame)
                await up_writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            up_writer.close()

    async def _answers(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, fetches: set) -> None:
        try:
            while True:
                size = await up_reader.readexactly(4)
                frame = await up_reader.readexactly(int.from_bytes(size, "big"))
                correlation_id = int.from_bytes(frame[:4], "big", signed=True)
                if correlation_id in fetches:
                    fetches.discard(correlation_id)
                    self.fetches += 1
                    if self.delay_s > 0:
                        await asyncio.sleep(self.delay_s)
                writer.write(size + frame)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=10)


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
