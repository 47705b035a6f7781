"""Rescaling on Ray with the local broker: state follows its keys to any parallelism, by a
stop and a resume or by a rescale of the running flow, with a kill during the rescale's
restore; and each refusal of a snapshot that does not fit the flow, with its message."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow, KafkaSink, KafkaSource
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest_fit import SnapshotMismatch
from driftstream.engine.testing import PacedSource, cold_start, wait_for_actor
from driftstream.snapshots.store import SnapshotStore

from tests.engine.api.resume_flow import build as build_numbers
from tests.engine.api.resume_flow import failure_free_output as numbers_without_failures
from tests.engine.connectors.kafka.test_kafka import produce

pytestmark = pytest.mark.ray

KEYS = 29
PHASE = 1500


def count(n, doc):
    n = (n or 0) + 1
    return n, {"k": doc["k"], "i": doc["i"], "n": n}


def counting_flow(bs: str, src: str, dst: str, name: str = "counts") -> Flow:
    flow = Flow(name)
    (flow.source(KafkaSource(src, bs), name="docs").key_by(lambda d: d["k"], name="by_key")
         .stateful_map(count, name="count").sink(KafkaSink(dst, bs, name="out")))
    return flow


def feed(bs: str, topic: str, first: int, n: int) -> None:
    """Records i = first..first+n-1, key k<i % 29>, over 4 partitions."""
    produce(bs, topic, [(i % 4, 1_000_000 + i, json.dumps({"k": f"k{i % KEYS}", "i": i}).encode()) for i in range(first, first + n)])


def reference_counts(bs: str, src: str) -> list:
    """The sequential reference, from the input log alone: every record's t (its partition's
    time, then partition and offset), and each key's records counted in t order: ``(key, i, n)``.

    A partition's time is the running maximum of its timestamps, ticks included, under the
    source's outlier rule (:class:`PartitionClock`): a record far ahead of the partition's time
    that the next one does not follow is clamped. Here that is a lone tick (stamped with the
    wall clock) between records stamped 1,000,000 + i, as a source that caught up with the
    feed appends it; ticks in a row move the time."""
    from kafka import TopicPartition

    from driftstream.engine.connectors.kafka.io import consumer, read_partition
    from driftstream.engine.connectors.kafka.source import MAX_TIME_JUMP_S, TICK_HEADER
    from driftstream.engine.connectors.partition_clock import PartitionClock

    c = consumer(bs)
    timed = []
    try:
        for p in range(4):
            clock, stamped = PartitionClock(None, int(MAX_TIME_JUMP_S * 1000)), []
            for rec in read_partition(c, TopicPartition(src, p), 0):
                stamped += clock.offer(rec.timestamp, rec)
            for rec, ts in stamped + clock.finish():
                if not any(k == TICK_HEADER for k, _ in rec.headers or ()):
                    timed.append(((ts, p, rec.offset), json.loads(rec.value)))
    finally:
        c.close()
    counts: dict = defaultdict(int)
    out = []
    for _, doc in sorted(timed, key=lambda e: e[0]):
        counts[doc["k"]] += 1
        out.append((doc["k"], doc["i"], counts[doc["k"]]))
    return sorted(out)


def check_counts(bs: str, src: str, dst: str, n: int) -> None:
    expected = reference_counts(bs, src)
    assert sorted(i for _, i, _ in expected) == list(range(n))
    got = sorted((v["k"], v["i"], v["n"]) for _, v in read_kafka_sink(bs, dst))
    assert got == expected  # every record counted once, each key going on from its last count


def written(bs: str, dst: str) -> int:
    """Records in the sink topic (each an output: the sink writes no other record): the sum of
    its partitions' true ends, without reading them all (read_kafka_sink waits 300 ms of
    silence per partition)."""
    from driftstream.engine.connectors.kafka.io import consumer, topic_end

    c = consumer(bs)
    try:
        return topic_end(c, dst, 4)
    finally:
        c.close()


def wait_released(bs: str, dst: str, n: int, handle, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while written(bs, dst) < n:
        assert time.time() < deadline, f"{len(read_kafka_sink(bs, dst))} of {n} outputs after {timeout} s: {handle.status()}"
        time.sleep(0.2)


def topics(bs: str) -> tuple:
    src, dst = f"docs-{uuid.uuid4().hex[:8]}", f"counts-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, src, 4)
    ensure_topic(bs, dst, 4)
    return src, dst


def test_rescale_a_running_flow_with_a_kill_during_its_restore_then_stop_and_resume_at_2_then_3(ray_session, kafka_broker,
                                                                                                   tmp_path):
    """Keyed running counts through Kafka, exactly-once, on one flow and its snapshots (each
    flow over a topic costs a start and a check of every count):

    handle.rescale(3) then rescale(1) while input keeps coming; an instance is killed as the
    first rescale restarts the run: it recovers from the reassigned snapshot.

    Then the issue's scenario: stopped and resumed at another parallelism twice (1 -> 2 -> 3).

    No count is lost or doubled: every key goes on from its last count."""
    bs = kafka_broker.bootstrap_servers
    src, dst = topics(bs)
    options = dict(guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    feed(bs, src, 0, PHASE)
    handle = counting_flow(bs, src, dst, name="live").start(parallelism=2, faults={"rescale_restore": ["live/by_key/1"]}, **options)
    wait_released(bs, dst, PHASE // 2, handle)
    report = handle.rescale(3)
    assert (report["from"], report["to"]) == (2, 3) and report["snapshot"] is not None
    # Where restart_s went: its steps, which add up to no more than it (the last step ends before it is read).
    assert list(report["steps_s"]) == ["reassign", "kill", "reset", "connect", "start"]
    assert all(s >= 0 for s in report["steps_s"].values()) and sum(report["steps_s"].values()) <= report["restart_s"]
    assert all(name.startswith("live/") for name in report["resets_s"])  # the survivors reset in place, if any
    feed(bs, src, PHASE, PHASE)
    wait_released(bs, dst, PHASE + PHASE // 2, handle)
    assert handle.rescale(1)["to"] == 1
    feed(bs, src, 2 * PHASE, PHASE)
    wait_released(bs, dst, 3 * PHASE, handle)
    status = handle.status()
    assert status["parallelism"] == 1 and [r["to"] for r in status["rescales"]] == [3, 1]
    assert len(status["recoveries"]) >= 1  # the kill during the restore
    handle.stop(timeout=60)

    for phase, parallelism in ((3, 2), (4, 3)):
        feed(bs, src, phase * PHASE, PHASE)
        handle = counting_flow(bs, src, dst, name="live").start(parallelism=parallelism, resume=True, **options)
        wait_released(bs, dst, (phase + 1) * PHASE, handle)
        status = handle.status()
        # A stop's snapshot is drained: the resume restored at the new parallelism at once.
        assert status["parallelism"] == parallelism and status["rescales"] == []
        assert len(status["key_groups"]["by_key"]) == parallelism
        handle.stop(timeout=60)
    check_counts(bs, src, dst, 5 * PHASE)


def test_a_fused_run_recovers_from_a_kill_reports_every_step_and_rescales_to_2_and_back(ray_session, kafka_broker, tmp_path):
    """At parallelism 1 the whole flow runs in one actor (a fused plan): a kill of it recovers
    exactly-once, a standby taking its place; status() lists every step and the key_by's
    groups; a live rescale to 2 moves the count's state from the source's stage to the
    key_by's, and back to 1."""
    import ray

    bs = kafka_broker.bootstrap_servers
    src, dst = topics(bs)
    feed(bs, src, 0, PHASE)
    flow = counting_flow(bs, src, dst, name="fused")
    steps = [s.name for s in flow.plan(1).steps]  # the source's dead letters among them
    assert [s.steps for s in flow.plan(1).stages] == [steps] and "by_key" in steps
    with cold_start():  # the flow's own standby, fused/standby/0 (a warm actor would stand by instead)
        handle = flow.start(parallelism=1, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                            standbys=1)
        try:
            wait_released(bs, dst, PHASE // 3, handle)
            status = handle.status()  # (elements count this incarnation: read before the kill)
            assert list(status["steps"]) == steps and status["steps"]["by_key"]["elements"] > 0
            deadline = time.time() + 60
            while not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == "fused/standby/0"]:
                assert time.time() < deadline
                time.sleep(0.05)
            assert ray.get(ray.get_actor("fused/standby/0", namespace="driftstream").ping.remote(), timeout=60)  # started
            ray.kill(wait_for_actor("fused/docs/0", timeout=30), no_restart=True)
            while not handle.status()["recoveries"]:  # the kill was noticed and recovered from
                assert time.time() < deadline, handle.status()
                time.sleep(0.1)
            assert "fused/docs/0 (standby)" in handle.status()["recoveries"][0]["resets_s"]  # the spare took its place
            wait_released(bs, dst, PHASE, handle)
            assert handle.status()["key_groups"] == {"by_key": ["0-127"]}
            assert handle.rescale(2)["to"] == 2
            feed(bs, src, PHASE, PHASE)
            wait_released(bs, dst, 2 * PHASE, handle)
            assert len(handle.status()["key_groups"]["by_key"]) == 2
            assert handle.rescale(1)["to"] == 1
            feed(bs, src, 2 * PHASE, PHASE // 2)
            wait_released(bs, dst, 2 * PHASE + PHASE // 2, handle)
        finally:
            handle.stop(timeout=60)
    check_counts(bs, src, dst, 2 * PHASE + PHASE // 2)


def test_a_driver_killed_then_resumed_at_another_parallelism(ray_session, tmp_path, tmp_path_factory):
    """A crash leaves output past the newest snapshot in the sinks: the resume at 3 first
    replays at the snapshot's parallelism until it has caught up, then rescales; the output
    is a failure-free run's."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import ray

    from tests.engine.api.resume_flow import N

    expected = numbers_without_failures(tmp_path_factory)
    out, snaps = tmp_path / "out", tmp_path / "snaps"
    driver = subprocess.Popen([sys.executable, "-m", "tests.engine.api.resume_flow", ray.get_runtime_context().gcs_address, str(out),
                               str(snaps)], cwd=Path(__file__).resolve().parents[3], start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (out.exists() and len(read_file_sink(out, "out")) > N // 3 and SnapshotStore(str(snaps)).committed_ids()):
            assert time.time() < deadline and driver.poll() is None
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    result = build_numbers(str(out)).run(parallelism=3, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(snaps),
                                         resume=True)
    assert read_file_sink(out, "out") == expected
    assert result.metrics.elements["numbers"] < N


def _numbers(out, name="fits", steps=("roll",), max_parallelism=128):
    flow = Flow(name, max_parallelism=max_parallelism)
    s = flow.source(PacedSource(list(range(400)), rate=1000, partitions=2), name="numbers").key_by(lambda x: x % 5, name="by_mod")
    for step in steps:
        s = s.stateful_map(lambda st, x: ((st or 0) + x, x), name=step)
    s.sink(FileSink(str(out), name="out"))
    return flow


def test_each_snapshot_that_does_not_fit_is_refused_before_anything_starts(ray_session, tmp_path):
    snaps = str(tmp_path / "snaps")
    options = dict(guarantee="exactly-once", snapshot_interval=0.05, snapshot_dir=snaps)
    _numbers(tmp_path / "a").run(parallelism=2, **options)
    committed = SnapshotStore(snaps).committed_ids()
    assert committed
    with pytest.raises(SnapshotMismatch, match="is of flow 'fits', not 'other'.*fresh=True"):
        _numbers(tmp_path / "b", name="other").run(parallelism=2, resume=True, **options)
    with pytest.raises(SnapshotMismatch, match="holds snapshots of flow 'fits'.*fresh=True"):
        _numbers(tmp_path / "b", name="other").run(parallelism=2, **options)
    assert SnapshotStore(snaps).committed_ids() == committed  # nothing wiped
    with pytest.raises(SnapshotMismatch, match="max_parallelism=128, and flow 'fits' has 64"):
        _numbers(tmp_path / "b", max_parallelism=64).run(parallelism=2, resume=True, **options)
    with pytest.raises(SnapshotMismatch, match="state of step 'roll', which the flow no longer has"):
        _numbers(tmp_path / "b", steps=("total",)).run(parallelism=2, resume=True, **options)
    _numbers(tmp_path / "b", steps=("total",)).run(parallelism=2, resume=True, allow_state_changes=True, **options)
    _numbers(tmp_path / "c", name="other").run(parallelism=2, fresh=True, **options)  # fresh discards them
    assert SnapshotStore(snaps).read_latest_manifest()["flow"] == "other"


def test_a_sink_topic_with_fewer_partitions_than_the_parallelism_is_refused(ray_session, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap_servers
    src, dst = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, src, 2)
    ensure_topic(bs, dst, 2)
    with pytest.raises(FlowError, match=f"sink 'out': sink topic '{dst}' has 2 partitions but the flow writes 3"):
        counting_flow(bs, src, dst, name="narrow").start(parallelism=3, guarantee="exactly-once", snapshot_dir=str(tmp_path / "s"))
    handle = counting_flow(bs, src, dst, name="narrow").start(parallelism=2, guarantee="exactly-once", snapshot_dir=str(tmp_path / "s"))
    with pytest.raises(FlowError, match="has 2 partitions but the flow writes 3"):
        handle.rescale(3)
    assert handle.status()["parallelism"] == 2  # still running as it was
    handle.stop(timeout=60)
