"""The Avro example: totals per customer in Avro, the one non-Avro record a dead letter."""

from __future__ import annotations

import uuid

from driftstream.engine import SchemaRegistry
from driftstream.engine.connectors.kafka.local_registry import LocalRegistry
from driftstream.engine.connectors.kafka.schema_registry import RegistryDecoder
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.examples.orders_avro import flow


def test_the_totals_are_the_running_sums_and_the_bad_record_a_dead_letter(kafka_broker):
    registry, tag = LocalRegistry(), uuid.uuid4().hex[:6]
    try:
        bs = kafka_broker.bootstrap_servers
        result = flow(bs, registry.url, tag).run(runtime="simulator", parallelism=2, seed=1)
        totals = [t for _, t in read_kafka_sink(bs, f"totals-{tag}", decode=RegistryDecoder("avro", SchemaRegistry(registry.url), f"totals-{tag}"))]
    finally:
        registry.close()
    assert len(totals) == 200 and result.metrics.step_dead_letters == {"orders": 1}
    last = {}
    for t in totals:
        last[t["customer"]] = t["total"]
    assert last == {f"c{c}": sum(i for i in range(200) if i % 5 == c) for c in range(5)}
