"""Registry formats on Kafka: Avro, JSON Schema and Protobuf values in Confluent's wire
format, through confluent-kafka's serializers, against the local registry behind
the same REST API (local_registry.py); the local broker; Ray for the processes."""

from __future__ import annotations

import json
import uuid

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from driftstream.engine import Flow, KafkaSink, KafkaSource
from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.schema_registry import RegistryDecoder, RegistryEncoder, RegistryUnavailable, SchemaRegistry
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink
from driftstream.engine.connectors.kafka.local_registry import LocalRegistry

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "k", "type": "string"}, {"name": "v", "type": "long"}]})
TOTAL = json.dumps({"type": "record", "name": "Total", "namespace": "shop",
                    "fields": [{"name": "k", "type": "string"}, {"name": "total", "type": "long"}]})
TOTAL_JSON = json.dumps({"type": "object", "properties": {"k": {"type": "string"}, "total": {"type": "integer"}}, "required": ["k", "total"]})


@pytest.fixture
def registry():
    server = LocalRegistry(basic_auth=("flow", "s3cret"))
    yield server
    server.close()


def _total(t, o):
    t = (t or 0) + o["v"]
    return t, {"k": o["k"], "total": t}


def _expected(orders: list) -> list:
    totals: dict = {}
    out = []
    for o in orders:
        totals[o["k"]] = totals.get(o["k"], 0) + o["v"]
        out.append({"k": o["k"], "total": totals[o["k"]]})
    return out


def _produce(bs: str, topic: str, values: list) -> None:
    w = PartitionWriter(bs, topic, 0)
    w.write([(v, []) for v in values])
    w.close()


def _orders_topic(kafka_broker, registry, n: int, bad: tuple = ()) -> tuple:
    """``(servers, input topic, output topic, SchemaRegistry, orders)``: ``n`` Avro orders in a
    one-partition topic, ``bad`` records inserted at offset 10."""
    bs, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    src, dst = f"orders-{tag}", f"totals-{tag}"
    ensure_topic(bs, src, 1)
    auth = SchemaRegistry(registry.url, basic_auth=("flow", "s3cret"))
    orders = [{"k": "abc"[i % 3], "v": i} for i in range(n)]
    encode = RegistryEncoder("avro", auth, src, ORDER)
    values = [encode(o) for o in orders]
    values[10:10] = [bad_record(values) for bad_record in bad]
    _produce(bs, src, values)
    return bs, src, dst, auth, orders


def _flow(name, bs, src, dst, auth, out_format="avro"):
    flow = Flow(name)
    schema = TOTAL if out_format == "avro" else TOTAL_JSON
    (flow.source(KafkaSource(src, bs, value_format="avro", schema_registry=auth, bounded=True), name="orders")
         .key_by(lambda o: o["k"]).stateful_map(_total, name="total")
         .sink(KafkaSink(dst, bs, value_format=out_format, schema=schema, schema_registry=auth)))
    flow.dead_letters(MemorySink("dlq"))
    return flow


@pytest.mark.parametrize("out_format", ["avro", "json-schema"])
def test_avro_in_avro_or_json_schema_out_and_bad_records_are_dead_letters(kafka_broker, registry, out_format):
    bad = (lambda values: b'{"k": "a", "v": 1}', lambda values: b"\x00\x00\x00\x00\x63" + values[0][5:])  # JSON; an unknown schema id
    bs, src, dst, auth, orders = _orders_topic(kafka_broker, registry, 40, bad)
    result = _flow(f"reg-{src}", bs, src, dst, auth, out_format).run(runtime="simulator", parallelism=2, seed=1)
    decode = RegistryDecoder(out_format, auth, dst)
    got = [p for _, p in read_kafka_sink(bs, dst, decode=decode)]
    assert sorted(got, key=lambda r: (r["k"], r["total"])) == sorted(_expected(orders), key=lambda r: (r["k"], r["total"]))
    letters = result.output("dlq")
    assert [d.element.offset for d in letters] == [10, 11] and result.metrics.step_dead_letters == {"orders": 2}
    assert "wire format" in letters[0].error and "Schema not found" in letters[1].error
    assert f"{dst}-value" in registry.subjects and f"{src}-value" in registry.subjects


def test_the_record_strategy_names_the_subject_after_the_record(registry):
    auth = SchemaRegistry(registry.url, basic_auth=("flow", "s3cret"))
    RegistryEncoder("avro", auth, "t", TOTAL, subject_name_strategy="record")({"k": "a", "total": 1})
    RegistryEncoder("avro", auth, "t", ORDER, subject_name_strategy="topic-record")({"k": "a", "v": 1})
    assert set(registry.subjects) == {"shop.Total", "t-shop.Order"}


def test_protobuf_messages_in_and_out(registry):
    fdp = descriptor_pb2.FileDescriptorProto(name="total.proto", package="shop", syntax="proto3")
    m = fdp.message_type.add(name="Total")
    m.field.add(name="k", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    m.field.add(name="total", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    total = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Total"))
    auth = SchemaRegistry(registry.url, basic_auth=("flow", "s3cret"))
    raw = RegistryEncoder("protobuf", auth, "pt", protobuf_message=total)(total(k="a", total=5))
    assert raw[0] == 0 and RegistryDecoder("protobuf", auth, "pt", protobuf_message=total)(raw) == total(k="a", total=5)
    assert registry.schemas[0]["schemaType"] == "PROTOBUF"


def test_wrong_credentials_fail_the_run_rather_than_make_dead_letters(kafka_broker, registry):
    bs, tag = kafka_broker.bootstrap_servers, uuid.uuid4().hex[:8]
    src = f"orders-{tag}"
    ensure_topic(bs, src, 1)
    _produce(bs, src, [RegistryEncoder("avro", SchemaRegistry(registry.url, basic_auth=("flow", "s3cret")), src, ORDER)({"k": "a", "v": 1})])
    wrong = SchemaRegistry(registry.url, basic_auth=("flow", "guess"))
    assert "guess" not in repr(wrong)
    flow = Flow(f"reg-auth-{tag}")
    flow.source(KafkaSource(src, bs, value_format="avro", schema_registry=wrong, bounded=True)).sink(MemorySink("out"))
    flow.dead_letters(MemorySink("dlq"))
    with pytest.raises(RegistryUnavailable, match="Unauthorized"):
        flow.run(runtime="simulator")


def test_what_a_format_needs_is_checked_when_the_flow_is_built():
    with pytest.raises(FlowError, match="needs schema_registry="):
        KafkaSource("t", "b:9092", value_format="avro")
    with pytest.raises(FlowError, match="writes with a schema: give schema="):
        KafkaSink("t", "b:9092", value_format="avro", schema_registry="http://r:8081")
    with pytest.raises(FlowError, match="needs protobuf_message="):
        KafkaSource("t", "b:9092", value_format="protobuf", schema_registry="http://r:8081")
    with pytest.raises(FlowError, match="subject_name_strategy is one of"):
        KafkaSink("t", "b:9092", value_format="avro", schema=TOTAL, schema_registry="http://r:8081", subject_name_strategy="name")
    with pytest.raises(FlowError, match="value_format= or encode=, not both"):
        KafkaSink("t", "b:9092", value_format="avro", schema=TOTAL, schema_registry="http://r:8081", encode=str.encode)


def test_avro_exactly_once_on_ray(ray_session, kafka_broker, registry, tmp_path):
    """The encoders and decoders cross into the actors' processes (their HTTP clients are made there)."""
    bs, src, dst, auth, orders = _orders_topic(kafka_broker, registry, 300)
    _flow(f"reg-ray-{src}", bs, src, dst, auth).run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2,
                                                    snapshot_dir=str(tmp_path / "snaps"))
    got = [p for _, p in read_kafka_sink(bs, dst, decode=RegistryDecoder("avro", auth, dst))]
    assert got == _expected(orders)  # one partition in: the input's order
