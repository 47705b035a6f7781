"""The Ray actor of an acker shard: a thin shell over :class:`~.acker_shard.AckShardHost`,
as :class:`~.actors.AckerActor` is over :class:`~.acker_host.AckerHost`. Stage instances
send it their acks on the data plane; it sends the root acker one
:class:`~.protocol.ShardFlush` per turn of its event loop and, once connected to its
instances (:meth:`AckShardActor.connect_instances`), passes the root's watermarks on to them."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import ray

from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.model.errors import DataPlaneError
from driftstream.engine.runtime.acker_shard import AckShardHost
from driftstream.engine.runtime.ray_session import node_ip
from driftstream.engine.runtime.transport import Endpoint


@ray.remote(num_cpus=0)
class AckShardActor:
    """Acker shard ``name``: listens for its instances, forwards batches to the root (``"acker"``)."""

    def __init__(self, key: PlaneKey, name: str = "acker shard") -> None:
        self.name = name
        self.error: Optional[BaseException] = None
        self.endpoint = Endpoint(key, self._on_message, me=name, on_error=self._on_plane_error)
        self.host = AckShardHost(lambda message: self.endpoint.send("acker", message),
                                 defer=lambda fn: asyncio.get_running_loop().call_soon(fn), relay=self.endpoint.send)

    def _on_message(self, message: Any) -> None:
        self.host.receive(message)

    async def listen(self) -> tuple:
        return await self.endpoint.listen(node_ip())

    async def connect(self, acker_address: tuple) -> None:
        """Open the connection to the root acker."""
        await self.endpoint.connect("acker", acker_address)

    async def connect_instances(self, addresses: dict) -> None:
        """Open connections to this shard's instances (key -> address): the root's watermarks go
        to this shard only, and on from here."""
        for key, address in addresses.items():
            await self.endpoint.connect(key, address)
        self.host.instances = list(addresses)

    def _on_plane_error(self, peer: str, exc: BaseException) -> None:
        if self.error is None:
            self.error = DataPlaneError(peer, self.name, f"{type(exc).__name__}: {exc}")

    async def stats(self) -> dict:
        """Flushes folded, batches sent, CPU seconds of this process so far, and the error if any."""
        return {"received": self.host.received, "sent": self.host.sent, "cpu_s": time.process_time(),
                "error": None if self.error is None else str(self.error)}

    async def close(self) -> None:
        await self.endpoint.close()
