"""A Kafka connector whose broker cannot be reached fails within its own timeout, naming
itself, the address and what to check (before: 30 s of silence, then kafka-python's bare
"Unable to bootstrap from ..."), with one warning while it waits, not one per attempt."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from driftstream.engine.connectors.kafka.reach import BrokerUnreachable, reach
from driftstream.engine.connectors.kafka.sink import KafkaSink
from driftstream.engine.connectors.kafka.source import KafkaSource


def closed_port() -> int:
    """A port nothing listens on: bound, then closed (a connection to it is refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_source_at_a_closed_port_fails_within_broker_timeout_naming_itself_the_address_and_what_to_check(caplog):
    address = f"127.0.0.1:{closed_port()}"
    source = KafkaSource("events", address, broker_timeout_s=2.0)
    source.step_name = "clicks"
    began = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(BrokerUnreachable) as info:
        source.partitions()
    took = time.monotonic() - began
    assert 1.5 < took < 2.0 + 3.0  # it tried for broker_timeout_s (a broker may be starting), not kafka-python's 30 s
    text = str(info.value)
    for part in ("KafkaSource 'clicks'", "'events'", address, "within 2 s", "refused", "broker is running", "security_protocol"):
        assert part in text, (part, text)
    waits = [r for r in caplog.records if r.name.endswith("kafka.reach")]
    assert len(waits) == 1 and address in waits[0].getMessage()  # ~4 rounds of attempts, one warning


def test_a_server_that_takes_the_connection_but_is_no_kafka_broker_fails_within_the_timeout_too():
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        source = KafkaSource("events", address, broker_timeout_s=1.0)
        began = time.monotonic()
        with pytest.raises(BrokerUnreachable, match="no Kafka broker answered"):
            source.partitions()
        assert time.monotonic() - began < 1.0 + 1.0 + 3.0  # its check (<= broker_timeout_s), then the client's bootstrap


def test_sink_check_at_a_closed_port_fails_within_retry_s_naming_the_sink():
    address = f"127.0.0.1:{closed_port()}"
    sink = KafkaSink("counts", address, name="out", retry_s=1.0)
    began = time.monotonic()
    with pytest.raises(BrokerUnreachable, match=r"KafkaSink 'out' \(topic 'counts'\) could not reach a Kafka broker at 127\.0\.0\.1:"):
        sink.check(1)
    assert time.monotonic() - began < 1.0 + 3.0


def test_a_host_name_that_does_not_resolve_is_said_so():
    with pytest.raises(BrokerUnreachable, match="does not resolve"):
        reach("no-such-host.invalid:9092", "KafkaSource 'x'", 0.2)


def test_reach_returns_once_one_of_the_servers_answers():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        reach(f"127.0.0.1:{closed_port()},127.0.0.1:{listening.getsockname()[1]}", "KafkaSource 'x'", 1.0)


def test_a_flow_on_the_simulator_fails_within_the_sources_broker_timeout_too():
    """The simulator opened the source's dead-letter sink first, which waited its retry_s (60 s)."""
    from driftstream.engine import Flow
    from driftstream.engine.testing import MemorySink

    flow = Flow("no-broker")
    flow.source(KafkaSource("events", f"127.0.0.1:{closed_port()}", broker_timeout_s=1.0, bounded=True), name="clicks").sink(MemorySink("o"))
    began = time.monotonic()
    with pytest.raises(BrokerUnreachable, match="KafkaSource 'clicks'") as info:
        flow.run(runtime="simulator")
    assert time.monotonic() - began < 1.0 + 3.0
    assert "source 'clicks' of flow 'no-broker', checked before the run started" in "".join(info.value.__notes__)


def test_on_ray_the_run_fails_alike_before_any_actor_starts(ray_session):
    from driftstream.engine import Flow
    from driftstream.engine.testing import MemorySink

    flow = Flow("no-broker-ray")
    flow.source(KafkaSource("events", f"127.0.0.1:{closed_port()}", broker_timeout_s=1.0, bounded=True), name="clicks").sink(MemorySink("o"))
    began = time.monotonic()
    with pytest.raises(BrokerUnreachable, match="KafkaSource 'clicks' \\(topic 'events'\\) could not reach a Kafka broker") as info:
        flow.run(parallelism=1)
    assert time.monotonic() - began < 1.0 + 5.0  # Ray is up (the session's): the driver's check, no actor
    assert "source 'clicks' of flow 'no-broker-ray', checked before the run started" in "".join(info.value.__notes__)
