"""What the replicas of a stage instance do (``replicas=r``, ``verify="first"``; issue 58, design
item 4), written once for the simulator (:mod:`.simulated_replicas`) and Ray (the stage and
acker actors, :mod:`driftstream.engine.control.replica_failover`):

- a sender gives every batch for a replicated instance to each live replica, a copy per replica
  on its own channel, its hold XORed into the sender's acks (:func:`fan_out_copies`);
- the acker's watermarks go to every replica, a snapshot's marker to the primary only
  (:func:`for_replica`);
- a replica that is not the primary drops its output but logs it (its cut is ``TOP``) and keeps
  what its sinks release until a commit says the sinks hold it (:class:`KeptBundles`);
- the primary dies: the next replica takes over (:func:`promote`): its output is sent again,
  what it kept that the sinks lack is written, and its next snapshot is a base.

>>> from driftstream.engine.runtime.outbound import ChannelBatch
>>> from driftstream.ordering.ack_table import AckTable
>>> acks = AckTable()
>>> batch = ChannelBatch(0, 7, [(1,)], ["x"], (0, 0), False, (3, 5))
>>> [(inc, c.channel) for inc, c in fan_out_copies(batch, [5, 6], acks)], dict(acks)
([(6, (3, 6))], {((3, 6), (1,)): 7})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from driftstream.barriers.bundle import Bundle
from driftstream.snapshots.changelog import Chain

from driftstream.engine.runtime.protocol import Watermark

#: The data-plane and acker address of a replica: ``(REPLICA, its incarnation)``.
REPLICA = "replica"


def address(incarnation: Any) -> tuple:
    """Where messages to replica ``incarnation`` go (and the token of its ReplaySent)."""
    return (REPLICA, incarnation)


def fan_out_copies(batch: Any, live: Iterable[Any], acks: Any) -> list:
    """``(incarnation, copy)`` of ``batch`` (a :class:`~.outbound.ChannelBatch` on its channel to
    one replica) for every other of the ``live`` replicas of its receiver, each on its own
    channel, its hold XORed into ``acks`` (the sender's, not yet flushed)."""
    out = []
    for inc in live:
        if inc != batch.channel[1]:
            copy = dataclasses.replace(batch, channel=(batch.channel[0], inc), times=list(batch.times), items=list(batch.items))
            acks.xor_many([(copy.channel, t) for t in copy.times], copy.batch_id)
            out.append((inc, copy))
    return out


def for_replica(message: Any, primary: bool) -> Any:
    """The acker's ``message`` as a replica gets it: a snapshot's marker only the primary (one
    part per instance); the others, its watermark."""
    if not primary and type(message) is Watermark and message.snapshot_id is not None:
        return Watermark(message.t)
    return message


class KeptBundles:
    """What the sinks of a replica that is not the primary released, ``(sink, bundle)`` in order,
    kept until a commit says the sinks hold it (:meth:`trim`)."""

    def __init__(self) -> None:
        self.bundles: list = []

    def keep(self, sink: Any, bundle: Bundle) -> None:
        self.bundles.append((sink, bundle))

    def trim(self, t: tuple) -> None:
        """Snapshot ``t`` committed: what is below it is in the sinks."""
        self.bundles = [(sink, b) for sink, b in self.bundles if not b.t_last < t]


def promote(host: Any, kept: list) -> list:
    """Replica ``host`` (an :class:`~.instance_host.InstanceHost`) becomes the primary: its output
    goes out from now on (its cut lifted), its sinks drop what they hold, its next snapshot is a
    base (its chains are not the dead primary's). Returns ``(sink, Bundle)`` of what it ``kept``
    that the sinks do not hold: the caller writes it before anything the host releases next."""
    host.recovery.cut = None
    through = {}
    for barrier, sink in host.rt.sinks.barriers.values():
        t_last, through[id(sink)] = sink.skip_replayed()
        barrier.skip_through(t_last, through[id(sink)])
    chains = host.snapshots.chains
    for name in chains:
        chains[name] = Chain(host.snapshots.base_every_s)
    rests = []
    for sink, bundle in kept:
        t = through.get(id(sink))
        rest = [e for e in bundle.elements if t is None or t < e[0]]
        if rest:
            rests.append((sink, Bundle(rest)))
    return rests


class DeferredPartition:
    """The sink partition of a replica that is not the primary, opened on first use (once it is
    promoted, or a restart asks what the sink holds): opened beside the primary's, a file sink's
    open would cut off a line the primary is writing. ``sink.open(index, partitions)`` then.
    Until it writes, a question (``t_last``, ``skip_replayed``) opens it again: what a partition
    opened at a restart (a rescale's, a rollback's) knows is stale once the primary wrote on, and a
    promotion that trusted it wrote again what the primary had written.

    >>> from driftstream.engine.testing import MemorySink
    >>> part = DeferredPartition(MemorySink("o"), 0, 1)
    >>> part.part is None, part.t_last(), part.part is not None
    (True, None, True)
    """

    def __init__(self, sink: Any, index: int, partitions: int) -> None:
        self.sink, self.index, self.partitions = sink, index, partitions
        self.part: Any = None
        self.written = False

    def _open(self) -> Any:
        if self.part is None:
            self.part = self.sink.open(self.index, self.partitions)
        return self.part

    def _asked(self) -> Any:
        """The partition to ask what the sink holds: until this replica writes, another does."""
        if not self.written and self.part is not None:
            self.part.close()
            self.part = None
        return self._open()

    def write(self, bundle: Bundle) -> None:
        self.written = True
        self._open().write(bundle)

    def t_last(self) -> Any:
        return self._asked().t_last()

    def skip_replayed(self) -> tuple:
        return self._asked().skip_replayed()

    def collected(self) -> Any:
        return None if self.part is None else self.part.collected()

    def close(self) -> None:
        if self.part is not None:
            self.part.close()

    def __getattr__(self, name: str) -> Any:  # what else a sink's partition offers (a writer's figures)
        if name in ("sink", "index", "partitions", "part", "written"):
            raise AttributeError(name)
        return getattr(self._open(), name)
