"""A stage instance's protocol (one host under the Ray actor and the simulator): what it
sends and in which order, a source's bound once per move, a failure, a closed incarnation."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.errors import StepError
from driftstream.engine.runtime.instance_host import ACKER, InstanceHost
from driftstream.engine.runtime.protocol import Ack, Prepared, Push, Watermark
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.testing import MemorySink, MemorySource


def _host(plan, index: int, sent: list, **options) -> InstanceHost:
    key = plan.instances[index]
    return InstanceHost(plan, key, InstanceConfig(batch_size=4), StageSnapshots(None, plan.participant(key), None),
                        lambda to, message: sent.append((to, message)), seed=1, **options)


def _two_stages(fn=lambda x: x + 1):
    f = Flow("host")
    f.source(MemorySource(list(range(6)))).key_by(lambda x: x % 2, name="parity").map(fn, name="plus").sink(MemorySink("out"))
    return f.plan(1, fuse=False)  # unfused: the source's stage sends batches to the key_by's


def test_a_flush_sends_batches_then_one_ack_with_the_bound_and_the_bound_once_per_move():
    sent: list = []
    host = _host(_two_stages(), 0, sent)
    try:
        host.guarded(host.rt.process_source, host.reader.poll(4))
        assert host.flush() == 4
        assert [type(m) for _, m in sent] == [Push, Ack] and sent[0][0] == (1, 0) and sent[1][0] == ACKER
        assert sent[1][1].source_index == 0 and sent[1][1].bound == host.last_bound is not None
        del sent[:]
        host.flush()
        assert sent == []  # nothing new: no ack, and the bound is not sent twice
    finally:
        host.close()


def test_a_step_error_fails_the_run_once_and_the_host_then_processes_nothing():
    failures, sent = [], []
    plan = _two_stages(lambda x: 1 // 0)
    host = _host(plan, 1, sent)
    host._fail = failures.append
    source = _host(plan, 0, [])
    try:
        source.guarded(source.rt.process_source, source.reader.poll(4))
        batch = source.rt.take_batches()[0][2]
        host.receive([batch])
        assert len(failures) == 1 and isinstance(failures[0], StepError) and host.failed
        assert host.guarded(host.rt.receive_many, [batch]) is False and sent == []
    finally:
        host.close()
        source.close()


def test_the_simulators_fail_raises_the_error():
    plan = _two_stages(lambda x: 1 // 0)
    host, source = _host(plan, 1, []), _host(plan, 0, [])
    try:
        source.guarded(source.rt.process_source, source.reader.poll(4))
        with pytest.raises(StepError):
            host.receive([source.rt.take_batches()[0][2]])
    finally:
        host.close()
        source.close()


def test_a_marker_sends_the_part_once_the_sinks_allow_and_a_closed_incarnation_sends_none(tmp_path):
    f = Flow("host")
    f.source(MemorySource([1, 2])).sink(MemorySink("o"))
    plan, sent = f.plan(1), []
    key = plan.instances[0]
    snaps = StageSnapshots(str(tmp_path), plan.participant(key), None, deferred=True, scratch=str(tmp_path / "scratch"))
    host = InstanceHost(plan, key, InstanceConfig(), snaps, lambda to, m: sent.append((to, m)))
    try:
        host.guarded(host.rt.process_source, host.reader.poll(2))
        host.flush()
        host.on_message(Watermark((9,), 1))
        snaps.write_next()
        parts = [m for to, m in sent if type(m) is Prepared]
        assert [(p.snapshot_id, p.instance) for p in parts] == [(1, key)]
        host.on_message(Watermark((10,), 2))
        host.closed = True  # reset since: the part written for the old incarnation goes nowhere
        snaps.write_next()
        assert len([m for _, m in sent if type(m) is Prepared]) == 1
    finally:
        host.close()


def test_a_batch_the_transport_refuses_fails_the_run_and_nothing_more_is_sent():
    """As StageActor._send does with FrameTooLarge: the flush stops at the refused batch (its
    acks would let the watermark pass elements that never left)."""
    sent, failures = [], []
    plan = _two_stages()
    key = plan.instances[0]
    host = None

    def send(to, message):
        if type(message) is Push:
            host.fail(ValueError("frame too large"))
        else:
            sent.append(message)

    host = InstanceHost(plan, key, InstanceConfig(batch_size=4), StageSnapshots(None, plan.participant(key), None), send,
                        fail=failures.append, seed=1)
    try:
        host.guarded(host.rt.process_source, host.reader.poll(4))
        host.flush()
        assert [str(e) for e in failures] == ["frame too large"] and host.failed and sent == []
        assert host.guarded(host.rt.process_source, host.reader.poll(4)) is False
    finally:
        host.close()
