"""The broker unreachable mid-run (connections refused, then stalled, 6 s in all) and back:
the sources' fetches and the sinks' writes retry with backoff (a sink first reads back what
landed), the run goes on, and its output is that of a run without the outage."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid

import pytest
from kafka.errors import KafkaConnectionError

from driftstream.engine import Flow, KafkaSink, KafkaSource
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from driftstream.engine.connectors.local_kafka import free_port, start_local_kafka
from driftstream.engine.testing import MemorySink, MemorySource
from tests.engine.connectors.kafka.broker_proxy import BrokerProxy
from tests.reference import reference_outputs

N = 3200
RATE = 400  # records/s: 8 s of input, the outage (6 s, from ~0.8 s on) in the middle of it


def _count(n, e):
    n = (n or 0) + 1
    return n, {"k": e["k"], "i": e["i"], "n": n}


def build(source, sink, name: str) -> Flow:
    flow = Flow(name)
    flow.source(source, name="events").key_by(lambda e: e["k"], name="key").stateful_map(_count, name="count").sink(sink)
    return flow


def _output(bootstrap: str, topic: str) -> list:
    try:
        return [p for _, p in read_kafka_sink(bootstrap, topic)]
    except Exception:  # the broker is away
        return []


def _per_key(rows: list) -> dict:
    """Each key's outputs in order: a key stays in one partition, so its order is the input's
    (the order across keys depends on the broker's timestamps)."""
    out: dict = {}
    for row in rows:
        out.setdefault(row["k"], []).append(row)
    return out


def feed(bootstrap: str, broker_port: int, topic: str, events: list, stop: threading.Event) -> threading.Thread:
    """Append ``events`` at RATE, event i to partition i % 2, straight to the broker (not
    through the proxy, which the broker advertises): the input keeps coming in the outage."""

    def run() -> None:
        writers = [PartitionWriter(bootstrap, topic, p) for p in (0, 1)]
        for w in writers:
            w.leader = dataclasses.replace(w.leader, port=broker_port)
        started = time.time()
        for i in range(0, len(events), 20):
            if stop.wait(max(0.0, started + i / RATE - time.time())):
                break
            for p, w in enumerate(writers):
                w.write([(json.dumps(e).encode(), []) for j, e in enumerate(events[i:i + 20], start=i) if j % 2 == p])
        for w in writers:
            w.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_six_second_broker_outage_leaves_the_output_unchanged(ray_session, tmp_path):
    events = [{"k": f"k{i % 4}", "i": i} for i in range(N)]  # key k{j} in partition j % 2
    expected = _per_key(reference_outputs(build(MemorySource(events, partitions=2), MemorySink("out"), "outage-ref"))["out"])
    proxy_port = free_port()
    broker = start_local_kafka(advertised_port=proxy_port)  # clients are told to use the proxy
    proxy = BrokerProxy(broker.port, proxy_port)
    stop = threading.Event()
    try:
        bootstrap, tag = broker.bootstrap_servers, uuid.uuid4().hex[:8]
        topic, out = f"in-{tag}", f"out-{tag}"
        ensure_topic(bootstrap, topic, 2)
        handle = build(KafkaSource(topic, bootstrap), KafkaSink(out, bootstrap), f"outage-{tag}").start(
            parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
        feeder = feed(bootstrap, broker.port, topic, events, stop)
        try:
            deadline = time.time() + 120
            released = lambda: handle.status()["released"]  # noqa: E731  (written and acknowledged by the sinks)
            while released() < N // 10:
                assert time.time() < deadline, handle.status()
                time.sleep(0.05)
            before = released()
            proxy.refuse()   # the scenario: 3 s of refused connections (reconnects back off), 3 s of stalled ones
            time.sleep(3)
            proxy.stall()
            time.sleep(3)
            during = released()
            proxy.forward()
            back, resumed = time.time(), None
            while released() < N:
                if resumed is None and released() > during:
                    resumed = time.time() - back
                assert time.time() < deadline, handle.status()
                time.sleep(0.05)
            status = handle.status()
        finally:
            stop.set()
            handle.stop(timeout=60)
        feeder.join(timeout=10)
        assert before < N, "the outage came after the run had written everything"
        assert during < N, "the run had written everything by the end of the outage"
        assert _per_key(_output(bootstrap, out)) == expected
        print(f"\nbroker back -> output growing again after {resumed if resumed is not None else 0:.2f} s; "
              f"recoveries {len(status['recoveries'])}")
    finally:
        proxy.close()
        broker.stop()


def test_a_broker_gone_for_longer_than_broker_timeout_s_fails_the_run_with_its_error(ray_session, tmp_path):
    """The source's fetcher gives up after ``broker_timeout_s``: the run fails with the
    broker's error within a few seconds more, rather than stall with status() running."""
    timeout_s = 3.0
    proxy_port = free_port()
    broker = start_local_kafka(advertised_port=proxy_port)
    proxy = BrokerProxy(broker.port, proxy_port)
    try:
        bootstrap, tag = broker.bootstrap_servers, uuid.uuid4().hex[:8]
        topic = f"gone-{tag}"
        ensure_topic(bootstrap, topic, 2)
        writer = PartitionWriter(bootstrap, topic, 0)
        writer.write([(json.dumps({"k": "k0", "i": i}).encode(), []) for i in range(50)])
        writer.close()
        handle = build(KafkaSource(topic, bootstrap, broker_timeout_s=timeout_s), MemorySink("out"), f"gone-{tag}").start(
            parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
        deadline = time.time() + 60
        while handle.status()["released"] < 50:
            assert time.time() < deadline, handle.status()
            time.sleep(0.05)
        proxy.refuse()
        gone = time.time()
        with pytest.raises(KafkaConnectionError, match=topic):
            handle.wait(timeout=60)
        failed_after = time.time() - gone
        print(f"\nbroker gone -> run failed after {failed_after:.1f} s (broker_timeout_s {timeout_s})")
        assert failed_after < 3 * timeout_s + 10, failed_after
    finally:
        proxy.close()
        broker.stop()
