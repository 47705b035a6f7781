"""The parts a replica does under either runtime (runtime/replicas.py): the fan-out's copies and
their holds, the marker to the primary only, the kept bundles, a sink opened only when used."""

from __future__ import annotations

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.file_sink import FileSink
from driftstream.engine.runtime.outbound import ChannelBatch
from driftstream.engine.runtime.protocol import Ack, Watermark
from driftstream.engine.runtime.replicas import DeferredPartition, KeptBundles, fan_out_copies, for_replica
from driftstream.ordering.ack_table import AckTable


def test_each_other_live_replica_gets_a_copy_on_its_own_channel_held_by_the_sender():
    acks = AckTable()
    batch = ChannelBatch(2, 41, [(5, 0)], ["a", "b"], (0, 1), False, (1, 7))
    copies = fan_out_copies(batch, [7, 8, 9], acks)
    assert [(inc, c.channel, c.items) for inc, c in copies] == [(8, (1, 8), ["a", "b"]), (9, (1, 9), ["a", "b"])]
    for _, copy in copies:  # each receiver's ack of its copy closes its channel's hold
        acks.xor_many([(copy.channel, t) for t in copy.times], copy.batch_id)
    assert not any(acks.values())
    assert fan_out_copies(batch, [7], AckTable()) == []  # the batch's own receiver alone: no copy


def test_a_marker_goes_to_the_primary_only():
    marker = Watermark((3, 0), snapshot_id=4)
    assert for_replica(marker, primary=True) == marker
    assert for_replica(marker, primary=False) == Watermark((3, 0))
    ack = Ack({}, None, None)
    assert for_replica(ack, primary=False) is ack


def test_kept_bundles_go_once_a_commit_says_the_sinks_hold_them():
    kept = KeptBundles()
    early, late = Bundle([((1, 0), "x")]), Bundle([((4, 0), "y"), ((6, 0), "z")])
    kept.keep("s", early)
    kept.keep("s", late)
    kept.trim((4, 0))
    assert kept.bundles == [("s", late)]


def test_a_deferred_partition_opens_its_file_only_when_used(tmp_path):
    part = DeferredPartition(FileSink(tmp_path, name="out"), 0, 1)
    assert list(tmp_path.iterdir()) == []
    part.close()
    assert part.t_last() is None and [p.name for p in tmp_path.iterdir()] == ["out-0.jsonl"]
    part.close()


def test_a_deferred_partition_asked_at_a_restart_sees_what_the_primary_wrote_since(tmp_path):
    """A relaunch (a rescale's, a rollback's) asks a replica's sink what it holds; the primary then
    writes on, dies, and the replica, promoted, asks again: the answer must be the file's now, or
    the promotion writes again what the primary wrote (seen on Ray after a rescale)."""
    sink = FileSink(tmp_path, name="out")
    replica = DeferredPartition(sink, 0, 1)
    assert replica.t_last() is None and replica.skip_replayed()[0] is None  # the restart's question
    primary = sink.open(0, 1)
    primary.write(Bundle([((1, 0, 0, 1, (), False), "a"), ((2, 0, 0, 2, (), False), "b")]))
    primary.close()
    t_last, _ = replica.skip_replayed()  # the promotion's
    assert t_last is not None and t_last.ts == 2
    replica.write(Bundle([((3, 0, 0, 3, (), False), "c")]))
    assert replica.t_last().ts == 3  # once it writes, its own partition knows
    replica.close()
