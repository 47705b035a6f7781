"""The acker of a simulated incarnation (:mod:`.simulator`), and its shards when the run has
them: the same :class:`~.acker_host.AckerHost` and :class:`~.acker_shard.AckShardHost` the
Ray actors drive, wired to the simulator's FIFO control queues (``send_control(sender,
receiver, message)``). Each shard folds its instances' messages and flushes its batch when
the scheduler chooses (:meth:`SimulatedAcker.flush_one`); the acker's watermarks and
markers go to the shards, which pass them on to their instances.

>>> queues = []
>>> acker = SimulatedAcker(1, lambda *m: queues.append(m), instances=[(0, 0), (0, 1)], shards=2)
>>> acker.receive((0, 1), Ack({}, 0, (3, 0, 0, 3)))          # instance (0, 1)'s flush, to shard 1
>>> queues, acker.pending
([], True)
>>> acker.flush_one(random.Random(0)); queues
[(('acker shard', 1), 'acker', ShardFlush(xors={}, bounds={0: (3, 0, 0, 3)}, flushes=1, parts=[]))]
"""

from __future__ import annotations

import random  # noqa: F401  (the doctest)
from typing import Any, Callable, Optional

from driftstream.ordering.ack_shards import shard_of
from driftstream.ordering.channel_tables import ChannelAcker

from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.acker_shard import AckShardHost
from driftstream.engine.runtime.instance_host import ACKER
from driftstream.engine.runtime.local_recovery import LocalRecovery
from driftstream.engine.runtime.protocol import Ack, ReplaySent, Watermark


class SimulatedAcker:
    """The root acker (``root``, what the simulator reads) and ``shards`` acker shards
    (round robin over ``instances``; none: the instances' messages go to the root)."""

    def __init__(self, sources: int, send_control: Callable[[Any, Any, Any], None], instances: list,
                 aligned: Optional[list] = None, shards: int = 0, local: Optional[LocalRecovery] = None) -> None:
        keys = [("acker shard", j) for j in range(shards)]
        #: recovery="local": the run's side of it (the acker's tables per channel, replacements catching up)
        self.local = local
        self.send_control = send_control
        if local is not None:  # a replacement catching up is told its frontier, never a watermark sent before it (see _told)
            send_control = self._told
        self.shard_by_instance = {key: shard_of(i, shards) for i, key in enumerate(instances)} if shards else {}
        self.root = AckerHost(sources, lambda to, message: send_control(ACKER, to, message), subscribers=instances, aligned=aligned,
                              relays=keys if shards else None, table=None if local is None else ChannelAcker(sources),
                              relay_of=lambda instance: keys[self.shard_by_instance[instance]])
        self.shard_by_key = {key: j for j, key in enumerate(keys)}
        self.shards = [AckShardHost(lambda message, key=key: send_control(key, ACKER, message), defer=lambda fn: None,
                                    relay=lambda to, message, key=key: send_control(key, to, message),
                                    instances=[k for k in instances if self.shard_by_instance[k] == j])
                       for j, key in enumerate(keys)]

    def _told(self, sender: Any, to: Any, message: Any) -> None:
        """recovery="local": the acker's (or a shard's) message to ``to``, unless it is a watermark
        and ``to`` a replacement catching up: one sent before the failure, still on its way
        through a shard, would tell the replacement the watermark past its replay."""
        if not (type(message) is Watermark and to in self.local.catching_up):
            self.send_control(sender, to, message)

    def receive(self, sender: Any, message: Any) -> None:
        """A message for the acker from ``sender``: through the sender's shard when there are shards."""
        j = self.shard_by_instance.get(sender)
        if self.local is not None:
            self._receive_local(sender, j, message)
        elif j is None:
            self.root.receive(message)  # no shards, or a shard's batch
        else:
            self.shards[j].receive(message)

    def _receive_local(self, sender: Any, j: Optional[int], message: Any) -> None:
        """recovery="local" (an instance's Ack comes tagged by its channel, see
        instance_recovery.py): a ReplaySent reaches the root behind the batch holding the
        replay's Ack (its shard flushes first, on the same connection) and ends the hold; then
        the replacements catching up are told the frontier."""
        local, table = self.local, self.root.table
        if j is not None:
            if type(message) is ReplaySent:
                self.shards[j].flush()
                self.send_control(("acker shard", j), ACKER, message)
            else:
                self.shards[j].receive(message)
            return
        if type(message) is ReplaySent:
            table.release((message.receiver, message.sender))
            message = Ack({}, None, None)  # the watermark the hold kept back is pushed
        self.root.receive(message)
        local.catch_up(table, self.root.pushed, lambda to, m: self.send_control(ACKER, to, m))  # not _told: its frontier
        if self.root.frontiers is not None:
            self.root.push_soon()  # a replacement that caught up may end the recovery's frontiers

    def relays(self, receiver: Any) -> bool:
        """Whether ``receiver`` is one of the shards (it passes the acker's watermarks on)."""
        return receiver in self.shard_by_key

    def relay(self, receiver: Any, message: Any) -> None:
        """The acker's watermark or marker, delivered to shard ``receiver``."""
        self.shards[self.shard_by_key[receiver]].receive(message)

    @property
    def pending(self) -> bool:
        """Whether a shard has a batch to flush."""
        return any(shard.pending for shard in self.shards)

    def flush_one(self, rng: random.Random) -> None:
        """Flush one shard's batch, chosen by ``rng`` among those with one."""
        rng.choice([shard for shard in self.shards if shard.pending]).flush()
