"""The acker's shards: each folds the flushes of its share of the stage instances into one
batch for the root acker (:class:`~.acker.Acker`), so that the root folds a batch per shard
per turn instead of a flush per instance.

Why a batch of net XORs, and not a shard's least time: a batch's id is XORed in by its
sender and out by its receiver, and the two may sit in different shards; neither shard's
entry then returns to zero, so "the least time over the shards" would stall (and a shard
that saw only the XOR-out would be wrong to call a time free). What a shard forwards is
the XOR of whole flushes, each one's XOR-out of its input and XOR-in of its output
together (as one flush is to a single acker); a pair that meets within one shard's batch
cancels there. With each shard's batches in FIFO order to the root, a source's bound
still follows the XORs it covers, so the root is a single acker that received the same
flushes in one of the orders the data plane could have delivered them: its watermarks
are a subsequence of that acker's (Timely's progress tracking batches its ChangeBatches
the same way).

>>> from driftstream.ordering.acker import Acker
>>> one, root, shards = Acker(sources=1), Acker(sources=1), [AckShard(), AckShard()]
>>> flushes = [(0, {(1, 0, 0, 1): 5}, 0, (1, 0, 0, 1)),      # instance 0 (the source) sends id 5 at t1
...            (1, {(1, 0, 0, 1): 5, (1, 0, 0, 3): 9}, None, None),   # instance 1 acks it, sends id 9 at t3
...            (0, {}, 0, (1, 0, 0, 4))]                     # the source's bound moves on
>>> for instance, xors, source, bound in flushes:
...     _ = one.update(xors, source, bound)
...     shards[instance % 2].add(xors, source, bound)
>>> for shard in reversed(shards):                          # instance 1's shard first: no bound yet
...     batch = shard.drain()
...     print(root.update_many(batch.xors, batch.bounds), batch.flushes)
(-inf,) 1
(1, 0, 0, 3) 2
>>> one.watermark == root.watermark, shards[0].drain()
(True, None)

Costs: :meth:`AckShard.add` O(k) for a flush of k times; :meth:`AckShard.drain` O(n) for
the n times with a net change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from .ack_table import AckTable
from .meta import Time


@dataclass
class ShardBatch:
    """A shard's batch for the root: the net XORs of ``flushes`` whole flushes and the newest
    bound of each source instance among them (source index -> bound)."""

    xors: dict
    bounds: dict = field(default_factory=dict)
    flushes: int = 0


class AckShard:
    """Folds its instances' flushes into the next :class:`ShardBatch` (see module doc)."""

    __slots__ = ("xors", "bounds", "flushes")

    def __init__(self) -> None:
        self.xors = AckTable()
        self.bounds: dict = {}
        self.flushes = 0

    def add(self, xors: Mapping, source: Optional[int] = None, bound: Optional[Time] = None) -> None:
        """One instance's flush (its XORs, and a source instance's new bound)."""
        self.xors.fold(xors)  # entries back at zero leave: a pair met in this shard
        if bound is not None:
            self.bounds[source] = bound
        self.flushes += 1

    def drain(self) -> Optional[ShardBatch]:
        """The batch of everything added since the last drain (None: nothing was)."""
        if not self.flushes:
            return None
        batch = ShardBatch(self.xors.drain(), self.bounds, self.flushes)
        self.bounds, self.flushes = {}, 0
        return batch


def shard_of(ordinal: int, shards: int) -> int:
    """The shard of the stage instance at ``ordinal`` in the plan's instance list (round robin:
    each shard takes instances of every stage).

    >>> [shard_of(i, 3) for i in range(7)]
    [0, 1, 2, 0, 1, 2, 0]
    """
    return ordinal % shards
