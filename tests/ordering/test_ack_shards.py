"""The acker's shards (ordering/ack_shards.py): flushes folded per shard into batches of net
XORs, the root folding the batches. Whatever the shards, the assignment of senders to them
and the order their batches arrive in, the root's watermark never passes an unprocessed
time, is never ahead of a single acker fed the same flushes in the same order, and reaches
TOP once everything is processed."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings, strategies as st

from driftstream.ordering.ack_shards import AckShard, ShardBatch, shard_of
from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import TOP

from tests.ordering.test_acker import Model, run_checking_the_watermark


def test_a_pair_that_meets_in_a_shard_cancels_there():
    shard = AckShard()
    shard.add({(1, 0, 0, 1): 5}, 0, (1, 0, 0, 1))
    shard.add({(1, 0, 0, 1): 5, (1, 0, 0, 2): 9})
    assert shard.drain() == ShardBatch({(1, 0, 0, 2): 9}, {0: (1, 0, 0, 1)}, 2)
    assert shard.drain() is None


def test_a_shard_keeps_each_sources_newest_bound():
    shard = AckShard()
    shard.add({}, 0, (1, 0, 0, 1))
    shard.add({}, 1, (1, 0, 1, 1))
    shard.add({}, 0, (2, 0, 0, 2))
    assert shard.drain().bounds == {0: (2, 0, 0, 2), 1: (1, 0, 1, 1)}


def test_a_pair_split_over_two_shards_holds_the_root_until_both_batches_arrive():
    """A sender's XOR-in and its receiver's XOR-out in different shards: the root's entry is
    non-zero (the time held) with either batch alone, zero with both."""
    root, a, b = Acker(sources=1), AckShard(), AckShard()
    a.add({(1, 0, 0, 1): 5}, 0, (1, 0, 0, 1))
    b.add({(1, 0, 0, 1): 5})
    a.add({}, 0, (1, 0, 0, 5))
    second = a.drain()
    first = b.drain()
    assert root.update_many(first.xors, first.bounds) < (1, 0, 0, 1)
    assert root.update_many(second.xors, second.bounds) == (1, 0, 0, 6)


class ShardedAcker:
    """What the Model's flushes reach: shard ``shard_of(sender)``, drained and delivered to the
    root at the Model's choosing; beside it, one acker fed the same flushes in the order the root
    gets them."""

    def __init__(self, sources: int, shards: int, assign: random.Random) -> None:
        self.root, self.one = Acker(sources), Acker(sources)
        self.shards = [AckShard() for _ in range(shards)]
        self.folded: list = [[] for _ in range(shards)]  # per shard: the flushes in its next batch
        self.queues: list = [deque() for _ in range(shards)]  # per shard: (batch, its flushes) on the way to the root
        self.assign, self.ordinals, self.sender = assign, {}, None

    def update(self, xors: dict, source=None, bound=None) -> None:
        ordinal = self.ordinals.setdefault(self.sender, self.assign.randrange(1000))
        j = shard_of(ordinal, len(self.shards))
        self.shards[j].add(dict(xors), source, bound)
        self.folded[j].append((dict(xors), source, bound))

    def drain(self, j: int) -> None:
        batch = self.shards[j].drain()
        if batch is not None:
            self.queues[j].append((batch, self.folded[j]))
            self.folded[j] = []

    def deliver(self, j: int) -> None:
        batch, flushes = self.queues[j].popleft()
        self.root.update_many(batch.xors, batch.bounds)
        for xors, source, bound in flushes:
            self.one.update(xors, source, bound)
        assert self.root.watermark <= self.one.watermark

    @property
    def watermark(self) -> tuple:
        return self.root.watermark

    def in_flight(self) -> int:
        return self.root.in_flight()


class ShardedModel(Model):
    """The acker test's pipeline model, its flushes to a :class:`ShardedAcker`; draining a shard
    and delivering a shard's batch are two more of its actions."""

    def __init__(self, times_per_source, depth, rng, id_rng, shards: int) -> None:
        super().__init__(times_per_source, depth, rng, id_rng)
        self.acker = ShardedAcker(len(times_per_source), shards, random.Random(rng.random()))

    def actions(self) -> list:
        acts = super().actions()
        acker = self.acker
        acts += [("drain", j) for j, s in enumerate(acker.shards) if s.flushes]
        acts += [("deliver", j) for j, q in enumerate(acker.queues) if q]
        return acts

    def step(self, act) -> None:
        kind, i = act
        if kind == "drain":
            self.acker.drain(i)
        elif kind == "deliver":
            self.acker.deliver(i)
        else:
            self.acker.sender = act
            super().step(act)


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.lists(st.integers(0, 20), max_size=8, unique=True).map(sorted), min_size=1, max_size=3),
    depth=st.integers(1, 3),
    shards=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_sharded_watermark_is_safe_bounded_by_one_acker_and_completes(times, depth, shards, seed):
    per_source = [[(ts, s, 0, ts) for ts in tss] for s, tss in enumerate(times)]
    model = ShardedModel(per_source, depth, random.Random(seed), random.Random(seed ^ 0x5EED), shards)
    run_checking_the_watermark(model)
    # Every shard drained and delivered, everything processed: the root is where one acker is.
    assert model.acker.in_flight() == 0
    assert model.acker.watermark == model.acker.one.watermark == TOP
