"""An instance's output logs: acker messages held until the entries recorded before them are
durable, in order; what a restore loads; the Ray actor's writer; the trim after a commit."""

from __future__ import annotations

import asyncio

from driftstream.ordering.meta import Meta
from driftstream.snapshots.output_log import OutputLog
from driftstream.snapshots.output_segments import OutputSegments
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.instance_host import InstanceHost
from driftstream.engine.runtime.output_logs import LogWriter, OutputLogs, trim_logs
from driftstream.engine.runtime.protocol import Ack
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.testing import MemorySink, MemorySource


def _record(log: OutputLog, t: int) -> None:
    log.record(Meta(t, 0, 0, t), [(Meta(t, 0, 0, t), t * 10, None)])


def test_messages_wait_for_the_entries_recorded_before_them_and_keep_their_order(tmp_path):
    a, b, sent = OutputLog(), OutputLog(), []
    logs = OutputLogs({"a": a, "b": b}, str(tmp_path), "f", 0, sent.append)
    logs.to_acker("nothing recorded yet")
    _record(a, 1)
    logs.to_acker("after a1")
    first = logs.take_writes()
    _record(b, 2)
    logs.to_acker("after b2")
    assert sent == ["nothing recorded yet"]
    logs.store(first)
    logs.written(first)
    assert sent == ["nothing recorded yet", "after a1"]
    logs.to_acker("behind b2")  # nothing new recorded, but it must not overtake the message before it
    assert sent[-1] == "after a1"
    logs.write_all()
    assert sent == ["nothing recorded yet", "after a1", "after b2", "behind b2"]


def test_without_a_store_nothing_is_held():
    log, sent = OutputLog(), []
    logs = OutputLogs({"a": log}, None, "f", 0, sent.append)
    _record(log, 1)
    logs.to_acker("ack")
    assert sent == ["ack"] and not logs.due


def test_a_restore_loads_every_instance_s_entries_from_its_t(tmp_path):
    for index, times in ((0, (1, 4)), (1, (2, 5))):
        log = OutputLog()
        logs = OutputLogs({"noisy": log}, str(tmp_path), "f", index, lambda m: None)
        for t in times:
            _record(log, t)
        logs.write_all()
    restored = OutputLog()
    OutputLogs({"noisy": restored}, str(tmp_path), "f", 0, lambda m: None, since=(2, 0, 0, 2))
    assert sorted(m[0] for m in restored.replay) == [2, 4, 5]
    fresh = OutputLog()
    OutputLogs({"noisy": fresh}, str(tmp_path), "f", 0, lambda m: None)  # a start from the beginning: nothing
    assert fresh.replay == {}


def _host(tmp_path, config: InstanceConfig, sent: list) -> InstanceHost:
    f = Flow("f")
    f.source(MemorySource([1, 2, 3])).map(lambda x: x * 10, name="noisy", deterministic=False).sink(MemorySink("o"))
    plan = f.plan(1)
    key = plan.instances[0]
    return InstanceHost(plan, key, config, StageSnapshots(None, plan.participant(key), None), send=lambda to, m: sent.append((to, m)))


def test_the_host_sends_its_ack_and_bound_once_the_log_is_durable(tmp_path):
    sent: list = []
    host = _host(tmp_path, InstanceConfig(snapshot_dir=str(tmp_path)), sent)
    host.guarded(host.rt.process_source, host.reader.poll(2))
    host.flush()
    assert sent == [] and host.output_logs.due
    host.write_output_logs()
    assert [type(m) for _, m in sent] == [Ack] and sent[0][1].bound is not None
    replayed = _host(tmp_path, InstanceConfig(snapshot_dir=str(tmp_path), recovering=True), [])
    assert sorted(replayed.output_logs.logs["noisy"].replay) == [Meta(0, 0, 0, 0), Meta(1, 0, 0, 1)]


def test_a_host_without_logged_steps_has_no_output_logs():
    f = Flow("f")
    f.source(MemorySource([1])).map(abs).sink(MemorySink("o"))
    plan = f.plan(1)
    key = plan.instances[0]
    host = InstanceHost(plan, key, InstanceConfig(), StageSnapshots(None, plan.participant(key), None), send=lambda to, m: None)
    assert host.output_logs is None


def test_the_actor_s_writer_writes_one_at_a_time_on_a_local_and_a_remote_store(tmp_path):
    async def run(uri: str) -> list:
        log, sent, failed = OutputLog(), [], []
        logs = OutputLogs({"noisy": log}, uri, "f", 0, sent.append)
        LogWriter(logs, failed.append)
        for t in range(5):
            _record(log, t)
            logs.to_acker(t)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(sent) == 5:
                break
        assert failed == []
        return sent

    assert asyncio.run(run(str(tmp_path / "local"))) == [0, 1, 2, 3, 4]
    assert asyncio.run(run(f"file://{tmp_path}/remote")) == [0, 1, 2, 3, 4]


def test_a_commit_trims_below_the_oldest_committed_snapshot(tmp_path):
    store = SnapshotStore(str(tmp_path), keep=2)
    log = OutputLog()
    logs = OutputLogs({"noisy": log}, str(tmp_path), "f", 0, lambda m: None)
    for t in range(1, 7):
        _record(log, t)
        logs.write_all()  # a segment per entry
    assert trim_logs(store) == 0  # nothing committed: a restore starts from the beginning
    for sid, t in ((1, 2), (2, 4), (3, 5)):
        store.write_manifest(sid, {"t": [t, 0, 0, t]})
    assert trim_logs(store) == 3  # below snapshot 2's T, the oldest kept
    assert len(OutputSegments(store, "f-noisy").names(None)) == 3
