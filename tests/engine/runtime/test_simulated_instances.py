"""The simulator's instances: what a crash loses and what it keeps, and what an instance sends."""

from __future__ import annotations

import os

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.protocol import Ack, Push
from driftstream.engine.runtime.simulated_instances import SimulatedInstances
from driftstream.engine.testing import MemorySink, MemorySource


def _plan():
    f = Flow("instances")
    f.source(MemorySource(list(range(6)))).key_by(lambda x: x % 2, name="parity").map(lambda x: x + 1, name="plus").sink(MemorySink("out"))
    return f.plan(1, fuse=False)  # two stages: the source's sends its batches to the other


def _start_all(live: SimulatedInstances, plan, bundles: list, sent: list = None) -> None:
    for n, instance in enumerate(plan.instances):
        live.start(plan, instance, InstanceConfig(batch_size=4), seed=n, base_every_s=0.0,
                   bundle_writer=lambda sid, sink, bundle: bundles.append((sid, sink, bundle)),
                   send=lambda to, message: (sent if sent is not None else []).append((to, message)))


def test_a_source_sends_its_batches_and_its_bound_once_until_it_moves():
    plan, live, sent = _plan(), SimulatedInstances(), []
    try:
        _start_all(live, plan, [], sent)
        (source,) = live.readers
        assert live.source_ready(source)
        live.stages[source].process_source(live.readers[source].poll(4))
        live.hosts[source].flush()
        batches = [(to, m.batch) for to, m in sent if type(m) is Push]
        assert [to for to, _ in batches] == [(1, 0)]
        assert sum(len(b.items) for _, b in batches) == 4
        acks = [m for to, m in sent if type(m) is Ack and to == "acker"]
        assert len(acks) == 1 and acks[0].bound is not None and acks[0].source_index == 0
        del sent[:]
        live.hosts[source].flush()
        assert not [m for _, m in sent if type(m) is Ack and m.bound is not None]  # the same bound is not sent twice
    finally:
        live.close()


def test_a_stop_loses_the_instances_and_keeps_the_sink_partitions():
    plan, live, bundles = _plan(), SimulatedInstances(), []
    sid = next(s.id for s in plan.steps if s.kind.is_sink)
    try:
        _start_all(live, plan, bundles)
        opened = live._open_sink(plan, sid, 0)
        live.stop()
        assert live.hosts == live.stages == live.snapshots == live.readers == {}
        assert live.sinks[(sid, 0)] is opened  # a crash keeps what a sink wrote
        _start_all(live, plan, bundles)  # a new incarnation writes the same partition, not a new one
        assert live._open_sink(plan, sid, 0) is opened
    finally:
        live.close()
    assert live.stages == {} and not os.path.exists(live.scratch)
