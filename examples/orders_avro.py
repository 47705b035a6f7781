"""Avro in and out under a schema registry: orders (``shop.Order``) from a Kafka topic,
a running total per customer, totals (``shop.Total``) to another topic, both in
Confluent's wire format; records that are not Avro go to the dead letters.

Run it on the local broker and the local registry (both started here and stopped when
the process exits), or on yours with ``DRIFTSTREAM_KAFKA`` and ``DRIFTSTREAM_REGISTRY``::

    driftstream run driftstream.examples.orders_avro:flow --parallelism 2
    python -m driftstream.examples.orders_avro          # runs, then reads the totals back
"""

from __future__ import annotations

import atexit
import json
import os
import uuid
from typing import Optional

from driftstream.engine import Flow, KafkaSink, KafkaSource, SchemaRegistry

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "customer", "type": "string"}, {"name": "amount", "type": "long"}]})
TOTAL = json.dumps({"type": "record", "name": "Total", "namespace": "shop",
                    "fields": [{"name": "customer", "type": "string"}, {"name": "total", "type": "long"}]})


def servers() -> tuple:
    """``(bootstrap servers, registry url)``: from the environment, else local ones (stopped at exit)."""
    bootstrap, url = os.environ.get("DRIFTSTREAM_KAFKA"), os.environ.get("DRIFTSTREAM_REGISTRY")
    if not bootstrap:
        from driftstream.engine.connectors.local_kafka import start_local_kafka

        broker = start_local_kafka()
        atexit.register(broker.stop)
        bootstrap = broker.bootstrap_servers
    if not url:
        from driftstream.engine.connectors.kafka.local_registry import LocalRegistry

        registry = LocalRegistry()
        atexit.register(registry.close)
        url = registry.url
    return bootstrap, url


def total(running: Optional[int], order: dict) -> tuple:
    running = (running or 0) + order["amount"]
    return running, {"customer": order["customer"], "total": running}


def write_orders(bootstrap: str, registry: SchemaRegistry, topic: str, n: int = 200) -> None:
    """``n`` Avro orders, and one record that is not Avro (a dead letter)."""
    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.kafka.schema_registry import RegistryEncoder
    from driftstream.engine.connectors.kafka.wire import PartitionWriter

    ensure_topic(bootstrap, topic, 2)
    encode = RegistryEncoder("avro", registry, topic, ORDER)
    for p in (0, 1):
        writer = PartitionWriter(bootstrap, topic, p)
        values = [encode({"customer": f"c{i % 5}", "amount": i}) for i in range(p, n, 2)] + ([b'{"not": "avro"}'] if p == 0 else [])
        writer.write([(v, []) for v in values])
        writer.close()


def flow(bootstrap: Optional[str] = None, registry_url: Optional[str] = None, tag: Optional[str] = None) -> Flow:
    """The flow over a fresh pair of topics (orders written first)."""
    if bootstrap is None or registry_url is None:
        bootstrap, registry_url = servers()
    tag = tag or uuid.uuid4().hex[:6]
    registry = SchemaRegistry(registry_url)
    write_orders(bootstrap, registry, f"orders-{tag}")
    f = Flow("orders_avro")
    (f.source(KafkaSource(f"orders-{tag}", bootstrap, value_format="avro", schema_registry=registry, bounded=True), name="orders")
      .key_by(lambda o: o["customer"], name="customer")
      .stateful_map(total, name="total")
      .sink(KafkaSink(f"totals-{tag}", bootstrap, value_format="avro", schema=TOTAL, schema_registry=registry)))
    return f


def main() -> None:
    from driftstream.engine.connectors.kafka.schema_registry import RegistryDecoder
    from driftstream.engine.connectors.kafka.sink import read_kafka_sink

    bootstrap, url = servers()
    tag = uuid.uuid4().hex[:6]
    print(flow(bootstrap, url, tag).run(parallelism=2).metrics.summary())
    totals = read_kafka_sink(bootstrap, f"totals-{tag}", decode=RegistryDecoder("avro", SchemaRegistry(url), f"totals-{tag}"))
    last = {t["customer"]: t["total"] for _, t in totals}
    print(f"{len(totals)} totals; the last per customer: {last}")


if __name__ == "__main__":
    main()
