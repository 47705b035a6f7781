"""A replica's side of verify="majority" on Ray (runtime/replica_voter.py), on real instance
hosts without Ray: replicas fed the same input digest each epoch alike and a flipped value makes
one differ; an epoch's digest waits for its sinks' releases; the primary's gate writes only what
the votes passed (a bundle across the open time is split) and its snapshot part waits for those
writes."""

from __future__ import annotations

import random

from driftstream.barriers.bundle import Bundle
from driftstream.ordering.meta import TOP, Meta

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.instance_host import InstanceHost
from driftstream.engine.runtime.protocol import EpochDigest, Prepared
from driftstream.engine.runtime.replica_voter import EpochVoter
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.runtime.state_faults import flip_settled
from driftstream.engine.testing import MemorySink, MemorySource


def _replica(n: int, primary: bool, hold_bundles: bool = False) -> tuple:
    """A running sum per parity of 0..n-1 at parallelism 1; ``(host, voter, sent, written)``.
    ``hold_bundles``: the sink's bundles are taken as written and held (the gate's way)."""
    f = Flow("voter")
    f.source(MemorySource(range(n))).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x, (s or 0) + x)).sink(MemorySink("o"))
    plan, sent, written, held = f.plan(1), [], [], []
    key = plan.instances[0]
    writer = None if not hold_bundles else (lambda sid, sink, bundle: held.append((sid, sink, bundle)))
    host = InstanceHost(plan, key, InstanceConfig(), StageSnapshots(None, plan.participant(key), None), send=None,
                        incarnations={key: 1}, incarnation=1, **({"bundle_writer": writer} if writer else {}))
    voter = EpochVoter(host, 1, primary, sent.append, lambda sid, sink, bundle: written.append(bundle))
    host.guarded(host.rt.process_source, host.reader.poll(n))
    return host, voter, sent, written, held


def _epoch(host, voter, snapshot_id: int, t: tuple) -> None:
    host.apply_watermark(t)
    voter.marker(snapshot_id, t)


def test_replicas_digest_alike_and_a_flipped_value_differs():
    (a, va, sa, _, _), (b, vb, sb, _, _) = _replica(40, True), _replica(40, False)
    for host, voter in ((a, va), (b, vb)):
        _epoch(host, voter, 1, (20,))
    assert [m.digest for m in sa] == [m.digest for m in sb] and type(sa[0]) is EpochDigest
    assert flip_settled(b, random.Random(1)) is not None
    for host, voter in ((a, va), (b, vb)):
        _epoch(host, voter, 2, (30,))
    assert sa[1].digest != sb[1].digest  # the state at the epoch's end differs, though no output read the flip yet


def test_an_epoch_is_digested_once_its_sinks_released_it():
    host, voter, sent, _, held = _replica(40, True, hold_bundles=True)
    _epoch(host, voter, 1, (20,))
    assert sent == []  # the bundle below 20 is not acknowledged yet
    sid, _, bundle = held[0]
    host.bundle_written(sid, bundle)
    voter.report()
    assert [m.snapshot_id for m in sent] == [1]


def test_the_gate_writes_what_the_votes_passed_and_the_part_waits_for_it():
    host, voter, sent, written, _ = _replica(40, True)
    sink = object()
    voter.marks[5] = (25,)
    voter.hold(9, sink, Bundle([(Meta(t, 0, 0, t), t) for t in (18, 22, 26)]))
    voter.part(Prepared(5, (0, 0), {}))
    assert written == [] and sent == []
    voter.open((25,))
    assert [[p for _, p in b.elements] for b in written] == [[18, 22]] and sent == []  # split; the part waits for the write
    voter.written(written[0])
    assert [type(m) for m in sent] == [Prepared]
    voter.open(TOP)
    assert [[p for _, p in b.elements] for b in written] == [[18, 22], [26]] and not voter.drained()
    voter.written(written[1])
    assert voter.drained()
