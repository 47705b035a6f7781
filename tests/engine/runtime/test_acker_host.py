"""The acker's protocol (one host under the Ray actor and the simulator): coalesced
watermarks, the last watermark, frontiers of aligned sources, snapshot parts."""

from __future__ import annotations

from driftstream.ordering.meta import TOP

from driftstream.engine.model.manifest import SnapshotPart
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.protocol import Ack, Align, Prepared, Watermark

A, B = Instance(0, 0), Instance(0, 1)


def test_deferred_pushes_coalesce_a_burst_of_acks_into_one_watermark():
    sent, deferred = [], []
    host = AckerHost(1, lambda to, m: sent.append((to, m)), defer=deferred.append, subscribers=[A, B])
    host.receive(Ack({}, 0, (1, 0, 0, 1)))
    host.receive(Ack({}, 0, (2, 0, 0, 2)))
    assert sent == [] and len(deferred) == 1  # one push scheduled for the burst
    deferred.pop()()
    assert sent == [(A, Watermark((2, 0, 0, 3))), (B, Watermark((2, 0, 0, 3)))]
    assert host.pushed == (2, 0, 0, 3) and host.status()["updates"] == 2


def test_the_last_watermark_goes_through_finish_when_given():
    sent, finished = [], []
    host = AckerHost(1, lambda to, m: sent.append((to, m)), finish=finished.append, subscribers=[A])
    host.receive(Ack({}, 0, TOP))
    assert finished == [TOP] and sent == []
    plain = AckerHost(1, lambda to, m: sent.append((to, m)), subscribers=[A])
    plain.receive(Ack({}, 0, TOP))
    assert sent == [(A, Watermark(TOP))]


def test_aligned_sources_are_told_their_groups_frontier_once_per_move():
    sent = []
    host = AckerHost(2, lambda to, m: sent.append((to, m)), subscribers=[A, B], aligned=[(A, (0, 1)), (B, (0, 1))])
    host.receive(Ack({}, 0, (5, 0, 0, 5)))
    assert not [m for _, m in sent if type(m) is Align]  # B has not read: the frontier has not moved
    host.receive(Ack({}, 1, (3, 0, 0, 3)))
    aligns = [(to, m) for to, m in sent if type(m) is Align]
    assert [to for to, _ in aligns] == [A, B] and aligns[0][1] == aligns[1][1]
    host.receive(Ack({}, 1, None))
    assert len([m for _, m in sent if type(m) is Align]) == 2


def test_a_snapshot_completes_once_every_part_is_in_and_late_parts_are_ignored():
    sent, done = [], []
    host = AckerHost(1, lambda to, m: sent.append((to, m)), subscribers=[A, B])
    collector = host.begin_snapshot(7, done.append)
    assert [m for _, m in sent] == [Watermark(collector.t, 7)] * 2 and host.collecting is collector
    host.receive(Prepared(7, A, SnapshotPart()))
    assert done == [] and collector.missing == [B]
    host.receive(Prepared(7, B, SnapshotPart()))
    assert done == [collector]
    assert host.end_snapshot(7) is collector and host.collecting is None
    host.receive(Prepared(7, A, SnapshotPart()))  # a part of a snapshot given up on
    assert host.end_snapshot(7) is None
