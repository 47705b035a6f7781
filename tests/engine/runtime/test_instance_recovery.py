"""An incarnation's side of local recovery (``recovery="local"``), as InstanceHost drives it under
Ray and the simulator: what a sender logs and a replacement drops below its cut, how its acks
are tagged, and the order of a survivor's part when a peer fails."""

from __future__ import annotations

from driftstream.ordering.meta import BOTTOM

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.instance_host import ACKER, InstanceHost
from driftstream.engine.runtime.instance_recovery import InstanceRecovery
from driftstream.engine.runtime.outbound import ChannelBatch
from driftstream.engine.runtime.protocol import Ack, Push, ReplaySent
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.testing import MemorySink, MemorySource


def _item(t: int, tombstone: bool = False) -> tuple:
    return ((t, 0, 0, t, (), tombstone), f"x{t}", None)


def _plan():
    f = Flow("recovery")
    f.source(MemorySource(list(range(8)))).key_by(lambda x: x % 2, name="parity").map(lambda x: x, name="same").sink(MemorySink("out"))
    return f.plan(1, fuse=False)  # unfused: the source's stage sends batches to the key_by's


def test_a_replacement_drops_its_output_below_the_cut_but_logs_all_of_it():
    part = InstanceRecovery({(0, 0): 5, (1, 0): 6}, (0, 0))
    part.cut = (3, 0, 0, 0)
    acks: dict = {}
    below = ChannelBatch(1, 11, [(1, 0, 0, 1)], [_item(1), _item(2)], (0, 0), False, (5, 6))
    across = ChannelBatch(1, 12, [(2, 0, 0, 2)], [_item(2), _item(4)], (0, 0), False, (5, 6))
    assert part.sent((1, 0), below, acks) is None and acks == {((5, 6), (1, 0, 0, 1)): 11}  # its hold undone
    assert [m[0] for m, _, _ in part.sent((1, 0), across, acks).items] == [4]
    assert len(part.log) == 4  # a later failure of the receiver may restore a snapshot below the cut


def test_acks_and_a_source_bound_carry_the_incarnation():
    part = InstanceRecovery({(0, 0): 5}, (0, 0))
    ack = part.tagged(Ack({(4, 0, 0, 4): 3, ((5, 6), (2, 0, 0, 2)): 7}, 0, (9, 0, 0, 9)))
    assert ack.xors == {((5, 5), (4, 0, 0, 4)): 3, ((5, 6), (2, 0, 0, 2)): 7}  # a timer: its channel to itself
    assert ack.source_index == (0, 5) and ack.bound == (9, 0, 0, 9)  # a dead incarnation's bound is dropped by it


def test_a_survivor_sends_the_dead_its_buffer_then_the_replay_then_replay_sent_behind_its_ack():
    plan, sent = _plan(), []
    key = plan.instances[0]
    incarnations = {k: n for n, k in enumerate(plan.instances)}
    host = InstanceHost(plan, key, InstanceConfig(batch_size=4), StageSnapshots(None, plan.participant(key), None),
                        lambda to, message: sent.append((to, message)), seed=1, incarnations=incarnations)
    try:
        host.guarded(host.rt.process_source, host.reader.poll(3))
        host.flush()  # sent to the receiver's first incarnation, and logged
        host.guarded(host.rt.process_source, host.reader.poll(2))  # buffered when the receiver dies
        del sent[:]
        host.peer_failed((1, 0), 9, BOTTOM, batch_size=4)
        kinds = [(type(m).__name__, getattr(getattr(m, "batch", None), "channel", None)) for _, m in sent]
        # the buffer on the old channel (lost with the receiver, but logged), then its whole log on the new one
        assert kinds == [("Push", (0, 1)), ("Ack", None), ("Push", (0, 9)), ("Push", (0, 9)), ("Ack", None), ("ReplaySent", None)], kinds
        assert sorted(m[0] for _, msg in sent[2:4] for m, _, _ in msg.batch.items) == [0, 1, 2, 3, 4]
        assert sent[-1] == (ACKER, ReplaySent(9, key)) and incarnations[(1, 0)] == 9
        replay_holds = sent[4][1].xors
        assert sorted(replay_holds) == [((0, 9), (0, 0, 0, 0)), ((0, 9), (4, 0, 0, 4))]  # each batch holds its least time, on the new channel
    finally:
        host.close()
