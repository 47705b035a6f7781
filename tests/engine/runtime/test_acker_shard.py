"""Acker shards (runtime/acker_shard.py, ordering/ack_shards.py): a shard folds its instances'
messages into one batch per turn; the root acker folds the batches; in the simulator, runs
through shards keep exactly-once output under crashes and rescales."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from driftstream.ordering.meta import TOP

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.acker_shard import AckShardHost
from driftstream.engine.runtime.protocol import Ack, Prepared, ShardFlush, Told, Watermark
from driftstream.engine.runtime.simulator import Simulation

from tests.engine.runtime.test_simulated_rescale import FLOWS, _reference

A, B = Instance(0, 0), Instance(1, 0)
T1, T2, T3 = (1, 0, 0, 1), (1, 0, 0, 2), (1, 0, 0, 3)


def test_a_shard_sends_one_batch_per_turn_with_the_parts_after_the_acks():
    sent, later = [], []
    shard = AckShardHost(sent.append, defer=later.append)
    shard.receive(Ack({T1: 5}, 0, T1))
    shard.receive(Prepared(1, A, {"sources": {}}))
    shard.receive(Ack({T1: 5, T2: 9}, None, None))
    assert len(later) == 1 and sent == []
    later.pop()()
    assert sent == [ShardFlush({T2: 9}, {0: T1}, 2, [Prepared(1, A, {"sources": {}})])]
    shard.flush()  # nothing new: nothing sent
    assert len(sent) == 1 and (shard.received, shard.sent) == (2, 1)


def test_the_root_folds_a_shards_batch_as_the_flushes_it_holds():
    sent, deferred = [], []
    root = AckerHost(1, lambda to, m: sent.append((to, m)), defer=deferred.append, subscribers=[A, B])
    collector = root.begin_snapshot(1)
    sent.clear()
    root.receive(ShardFlush({T2: 9}, {0: T3}, 2, [Prepared(1, A, {"part": "a"})]))
    assert root.table.watermark == T2 and root.status()["updates"] == 2
    assert collector.parts == {A: {"part": "a"}}
    deferred.pop()()
    assert sent == [(A, Watermark(T2)), (B, Watermark(T2))]
    root.receive(ShardFlush({T2: 9}, {0: TOP}, 1, []))
    assert root.table.watermark == TOP


def test_a_pair_split_over_two_shards_holds_the_root_until_both_batches_are_in():
    """Instance A (the source) sends a batch at T1, instance B acks it: in different shards,
    the root holds T1 until both shards' batches are in, in either order."""
    for first in (0, 1):
        batches, root = [[], []], AckerHost(1, lambda to, m: None)
        shards = [AckShardHost(batches[j].append) for j in (0, 1)]
        shards[0].receive(Ack({T1: 5}, 0, T1))
        shards[1].receive(Ack({T1: 5, T3: 7}, None, None))
        shards[0].receive(Ack({}, 0, (1, 0, 0, 9)))
        for j in (first, 1 - first):
            for batch in batches[j]:
                root.receive(batch)
            if j == first:
                assert root.table.watermark <= T1
        assert root.table.watermark == T3


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_simulated_runs_through_acker_shards_give_the_sequential_output(name):
    """The simulator's property over one flow per stateful operator (windows fire at the
    watermark: one that ran ahead of an element in flight would drop it as late): crashes
    at any step and at the protocol's critical points, rescales, and 1 to 3 shards between
    the instances and the acker, their batches flushed whenever the scheduler chooses."""
    flow, _ = FLOWS[name]()
    wrong, batches = [], 0
    for seed in range(12):
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(0.005, 0.01, 0.02)[seed % 3])
        rescales = [1 + (seed + 1) % 3] if seed % 4 == 3 else []
        sim = Simulation(flow.plan(1 + seed % 3), config, crashes=seed % 3, rescales=rescales, acker_shards=1 + seed // 3 % 3)
        result = sim.run()
        batches += sum(shard.sent for shard in sim.ackers.shards)
        for sink, expected in _reference(name).items():
            if result.output(sink) != expected:
                wrong.append((seed, sink, sim.crash_points, sim.rescaling.done))
    assert not wrong, f"seeds whose output differs (seed, sink, crash points, rescales): {wrong[:5]}"
    assert batches > 0


def test_the_root_pushes_to_its_relays_and_collects_the_instances_parts():
    sent = []
    shards = [("acker shard", 0), ("acker shard", 1)]
    root = AckerHost(1, lambda to, m: sent.append((to, m)), subscribers=[A, B], relays=shards)
    collector = root.begin_snapshot(3)
    root.receive(ShardFlush({}, {0: T1}, 1, []))
    assert sent == [(shards[0], Watermark((-float("inf"),), 3)), (shards[1], Watermark((-float("inf"),), 3)),
                    (shards[0], Watermark((1, 0, 0, 2))), (shards[1], Watermark((1, 0, 0, 2)))]
    assert collector.missing == [A, B]  # the parts still come from the instances


def test_a_shard_passes_the_roots_watermarks_on_to_its_instances_in_order():
    relayed, later = [], []
    shard = AckShardHost(lambda m: None, defer=later.append, relay=lambda to, m: relayed.append((to, m)), instances=[A, B])
    shard.receive(Watermark(T1))
    shard.receive(Watermark(T1, 4))
    shard.receive(Watermark(T2))
    assert relayed == [(A, Watermark(T1)), (B, Watermark(T1)), (A, Watermark(T1, 4)), (B, Watermark(T1, 4)),
                       (A, Watermark(T2)), (B, Watermark(T2))]
    assert later == []  # passed on at once, never held for a flush


def test_a_recoverys_frontier_goes_through_the_shard_behind_what_it_still_passes_on():
    """recovery="local": each instance is told its own frontier; with shards it goes through the
    instance's shard, behind the watermarks and markers queued there (sent straight it overtook
    them: a replica then digested an epoch's end at a watermark past it)."""
    shards = [("acker shard", 0), ("acker shard", 1)]
    sent = []
    root = AckerHost(1, lambda to, m: sent.append((to, m)), subscribers=[A, B], relays=shards,
                     relay_of=lambda instance: shards[[A, B].index(instance)])
    root.diverge(SimpleNamespace(due=lambda: [(B, T2)], done=False))
    assert sent == [(shards[1], Told(B, T2))]
    relayed = []
    shard = AckShardHost(lambda m: None, relay=lambda to, m: relayed.append((to, m)), instances=[A, B])
    shard.receive(Watermark(T1, 4))
    shard.receive(Told(B, T2))
    assert relayed == [(A, Watermark(T1, 4)), (B, Watermark(T1, 4)), (B, Watermark(T2))]
