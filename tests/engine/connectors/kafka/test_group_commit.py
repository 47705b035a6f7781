"""KafkaSource(commit_group=...): each committed snapshot's offsets land in a Kafka consumer
group, so lag monitors see the flow's lag; a broker that is down costs a counted failure,
and the next snapshot commits. Against Tansu."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kafka import KafkaAdminClient, TopicPartition

from driftstream.engine import Flow
from driftstream.engine.connectors.kafka.group_commit import GroupCommitter
from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, true_end
from driftstream.engine.connectors.kafka.source import KafkaSource
from driftstream.engine.connectors.local_kafka import free_port, start_local_kafka
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance
from driftstream.engine.testing import MemorySink
from driftstream.snapshots.store import SnapshotStore
from tests.engine.connectors.kafka.broker_proxy import BrokerProxy
from tests.engine.connectors.kafka.test_kafka import produce

N = 1500
#: Per partition, the records the last snapshot cannot hold: partition 1's last record (ts 2499)
#: lies above the watermark, which partition 0's last (ts 2498) holds back, with no ticks.
HELD_BACK = {0: 0, 1: 1}


def group_offsets(bs: str, group: str) -> dict:
    """``{partition: committed offset}`` of ``group``, as a lag monitor reads them."""
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        return {tp.partition: om.offset for tp, om in admin.list_group_offsets({group: None})[group].items()}
    finally:
        admin.close()


def _slow(doc):
    time.sleep(0.002)  # ~3 s for the backlog: snapshots commit while the flow is behind
    return doc["v"]


@pytest.mark.ray
def test_the_group_follows_the_committed_snapshots_and_shows_the_lag(ray_session, kafka_broker, tmp_path):
    bs, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    topic, group, name = f"lag-{tag}", f"lag-group-{tag}", f"lag-{tag}"
    ensure_topic(bs, topic, 2)
    produce(bs, topic, [(i % 2, 1_000 + i, json.dumps({"v": i}).encode()) for i in range(N)])
    flow = Flow(name)
    flow.source(KafkaSource(topic, bs, tick_interval=None, commit_group=group), name="in").map(_slow, name="slow").sink(MemorySink("out"))
    snaps = str(tmp_path / "snaps")
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=snaps, batch_size=32, max_inflight=64)
    behind, status = [], {}
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            offsets = group_offsets(bs, group)
            if offsets and sum(offsets.values()) < N - sum(HELD_BACK.values()):
                behind.append(N - sum(offsets.values()))  # the lag a monitor shows: end offsets - committed
            status = handle.status()
            if status["emitted"] == N and sum(status["commit_groups"]["in"]["committed"].values()) == N - sum(HELD_BACK.values()):
                break
            time.sleep(0.1)
    finally:
        handle.stop(timeout=60)
    assert behind and all(0 < lag < N for lag in behind), behind  # seen behind, mid-backlog
    latest = Manifest.from_json(SnapshotStore(snaps).read_latest_manifest())
    c = consumer(bs)
    ends = {p: true_end(c, TopicPartition(topic, p)) for p in range(2)}
    c.close()
    committed = group_offsets(bs, group)
    assert committed == latest.offsets(Instance(0, i) for i in range(2))  # the source is stage 0
    assert {p: ends[p] - committed[p] for p in ends} == HELD_BACK  # the lag once all is read
    assert status["commit_groups"]["in"]["failures"] == 0 and status["commit_groups"]["in"]["commits"] > 1


def test_a_broker_down_costs_a_counted_failure_and_the_next_offsets_commit():
    port = free_port()
    broker = start_local_kafka(advertised_port=port)
    proxy = BrokerProxy(broker.port, port=port)
    topic, group = f"down-{uuid.uuid4().hex[:8]}", "down-group"
    committer = GroupCommitter(f"127.0.0.1:{port}", topic, group, timeout_s=1.0)
    try:
        ensure_topic(f"127.0.0.1:{port}", topic, 2)
        committer.submit({0: 3, 1: 4})
        _wait(lambda: committer.commits == 1)
        proxy.refuse()
        began = time.monotonic()
        committer.submit({0: 5, 1: 6})
        assert time.monotonic() - began < 0.05  # the supervisor's loop does not wait for the broker
        _wait(lambda: committer.failures >= 1)
        # Refused at once, or timed out while the client retries: which one comes first is timing.
        assert committer.last_error.startswith(("KafkaTimeoutError", "KafkaConnectionError")), committer.last_error
        assert committer.committed == {0: 3, 1: 4}
        proxy.forward()
        committer.submit({0: 7, 1: 8})  # the next snapshot's offsets
        _wait(lambda: committer.committed == {0: 7, 1: 8})
        assert group_offsets(f"127.0.0.1:{port}", group) == {0: 7, 1: 8}
        assert committer.status() == {"group": group, "topic": topic, "committed": {0: 7, 1: 8}, "commits": 2,
                                      "failures": committer.failures, "last_error": None}
    finally:
        committer.close(timeout_s=5)
        proxy.close()
        broker.stop()


def _wait(what, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
