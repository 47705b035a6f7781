"""The acker's capacity bench (``driftstream bench acker``): its synthetic protocol settles as
it claims, through one acker and through shards; the fold figures on a tiny input; and on Ray
the real acker actor, with and without shard actors, folds every synthetic flush sent over
the data plane and settles every time (figures printed, times not asserted)."""

from __future__ import annotations

import pytest

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import TOP

from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.examples.benchmarks.acker_capacity import (
    binding_size, fold_cost, ray_ladder, settled_count, shard_batches, synthetic_acks, t_of)


@pytest.mark.parametrize("senders", [1, 2, 5])
def test_each_time_settles_once_every_sender_sent_the_next_flush(senders):
    acker = Acker(max(1, senders // 2))
    acks = synthetic_acks(senders, 4)
    for k in range(4):
        for ack in acks[k * senders:(k + 1) * senders]:
            acker.update(ack.xors, ack.source_index, ack.bound)
        assert acker.watermark == t_of(k)  # T(k - 1) settled, T(k) held by every sender's flush k
        assert settled_count(acker.watermark, 0) == k


@pytest.mark.parametrize("shards, per_batch", [(1, 1), (2, 3), (3, 5)])
def test_the_shards_batches_bring_the_root_where_one_acker_is(shards, per_batch):
    acks = synthetic_acks(6, 5)
    one, root = Acker(3), Acker(3)
    for ack in acks:
        one.update(ack.xors, ack.source_index, ack.bound)
    batches = shard_batches(acks, 6, shards, per_batch)
    for batch in batches:
        root.update_many(batch.xors, batch.bounds)
        assert root.watermark <= one.watermark
    assert root.watermark == one.watermark == t_of(4) and root.entries == one.entries
    assert sum(b.flushes for b in batches) == len(acks)


def test_fold_figures_on_a_tiny_input():
    plain = fold_cost(4, 20, turn=4, rounds=1)
    sharded = fold_cost(4, 20, turn=4, rounds=1, shards=2)
    print(plain, sharded)
    assert plain["acks"] == sharded["acks"] == 80 and plain["root_messages"] == 80
    assert sharded["root_messages"] < 80 and plain["capacity_acks_per_s"] > 0 and sharded["capacity_acks_per_s"] > 0
    assert binding_size(plain["capacity_acks_per_s"], 1) == plain["capacity_acks_per_s"]


def test_the_last_watermark_of_a_synthetic_run_holds_only_the_last_flush():
    host = AckerHost(2, lambda to, m: None)
    for ack in synthetic_acks(4, 6):
        host.receive(ack)
    assert host.pushed == t_of(5) and host.table.in_flight() == 1 and host.pushed != TOP


@pytest.mark.parametrize("shards", [0, 2])
def test_on_ray_the_acker_folds_every_flush_and_settles_every_time(ray_session, shards):
    rows = ray_ladder(2, [200], 0.5, shards=shards)
    row = rows[0]
    print(row)
    assert row["settled_all"] and row["samples"] > 0
    assert row["folded_acks_per_s"] > 0
    if shards:
        assert row["shards"] == 2 and row["root_batches"] > 0 and not row["shard_errors"]
