"""Registry formats on Kafka: Avro, JSON Schema and Protobuf values in Confluent's wire
format, through confluent-kafka's serializers, against the local registry behind
the same REST API (local_registry.py); the local broker; Ray for the processes."""

from __future__ import annotations

import json
import time
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


class FlakyRegistry:
    """A tiny HTTP server in front of ``registry``: answers ``status`` to the first ``failures``
    schema look-ups by id, or (``hang``) holds every request unanswered until closed; the
    rest it passes on. ``looked_up``: the look-ups it saw."""

    def __init__(self, registry: LocalRegistry, status: int = 429, failures: int = 0, hang: bool = False) -> None:
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.failures, self.looked_up, self.released = failures, 0, threading.Event()
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self, method: str) -> None:
                if hang:
                    flaky.released.wait(60)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                if self.path.startswith("/schemas/ids/"):
                    flaky.looked_up += 1
                    if flaky.failures > 0:
                        flaky.failures -= 1
                        return self._answer(status, json.dumps({"error_code": status, "message": f"status {status}"}).encode())
                request = urllib.request.Request(registry.url + self.path, data=body, method=method,
                                                 headers={k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")})
                try:
                    with urllib.request.urlopen(request, timeout=10) as reply:
                        self._answer(reply.status, reply.read())
                except urllib.error.HTTPError as err:
                    self._answer(err.code, err.read())

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [429, 408])
def test_a_rate_limited_registry_is_retried_not_a_dead_letter(kafka_broker, registry, status):
    """On bc7b6d0 the client's own 3 retries ran out and every record whose schema it could not
    look up (here all: one schema) became a dead letter."""
    bs, src, dst, auth, orders = _orders_topic(kafka_broker, registry, 20)
    flaky = FlakyRegistry(registry, status, failures=5)
    try:
        patient = SchemaRegistry(f"http://127.0.0.1:{flaky.port}", basic_auth=("flow", "s3cret"), timeout_s=30)
        flow = Flow(f"reg-429-{src}")
        flow.source(KafkaSource(src, bs, value_format="avro", schema_registry=patient, bounded=True), name="orders").sink(MemorySink("out"))
        flow.dead_letters(MemorySink("dlq"))
        result = flow.run(runtime="simulator")
    finally:
        flaky.close()
    assert result.output("dlq") == [] and result.output("out") == orders
    assert flaky.looked_up == 6  # five refusals (the old client gave up after four), then the schema


def test_a_registry_that_stays_unavailable_fails_the_decode_after_timeout_s(registry):
    flaky = FlakyRegistry(registry, 503, failures=1000)
    try:
        auth = SchemaRegistry(registry.url, basic_auth=("flow", "s3cret"))
        raw = RegistryEncoder("avro", auth, "t", ORDER)({"k": "a", "v": 1})
        decode = RegistryDecoder("avro", SchemaRegistry(f"http://flow:s3cret@127.0.0.1:{flaky.port}", timeout_s=1.0), "t")
        with pytest.raises(RegistryUnavailable) as failed:
            decode(raw)
    finally:
        flaky.close()
    text = str(failed.value)
    assert f"schema registry http://***@127.0.0.1:{flaky.port} (looking up schema id 1, topic 't')" in text
    assert "unavailable for 1 s (SchemaRegistry timeout_s" in text and "s3cret" not in text


def test_a_registry_url_and_its_errors_never_show_the_userinfo(registry):
    secret = SchemaRegistry(f"http://flow:s3cret@{registry.url.split('://')[1]}")
    assert repr(secret) == f"SchemaRegistry('http://***@{registry.url.split('://')[1]}')"
    with pytest.raises(RegistryUnavailable) as refused:
        RegistryDecoder("avro", SchemaRegistry(registry.url.replace("://", "://flow:guess@")), "t")(b"\x00\x00\x00\x00\x01\x02")
    assert "Unauthorized" in str(refused.value) and "guess" not in str(refused.value) and "***@" in str(refused.value)


def test_a_hanging_registry_fails_the_run_naming_it_without_recoveries(ray_session, kafka_broker, registry, tmp_path):
    """Each call times out after call_timeout_s, off the event loop: heartbeats go on. On
    bc7b6d0 the look-up blocked the source actor's event loop without a timeout: the actor
    was taken for hung and recovered over and over (8 recoveries in 90 s), without an error."""
    bs, src, dst, auth, orders = _orders_topic(kafka_broker, registry, 20)
    hanging = FlakyRegistry(registry, hang=True)
    try:
        url = f"http://flow:s3cret@127.0.0.1:{hanging.port}"
        flow = Flow(f"reg-hang-{src}")
        flow.source(KafkaSource(src, bs, value_format="avro", schema_registry=SchemaRegistry(url, timeout_s=6, call_timeout_s=1)),
                    name="orders").sink(MemorySink("out"))
        flow.dead_letters(MemorySink("dlq"))
        began = time.time()
        handle = flow.start(parallelism=1, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                            heartbeat_timeout=3)
        recoveries = []
        while handle.status().get("running") and time.time() - began < 60:
            recoveries = handle.status().get("recoveries", recoveries)
            time.sleep(0.5)
        with pytest.raises(RegistryUnavailable) as failed:
            handle.wait(timeout=60)
        took = time.time() - began
    finally:
        hanging.close()
    print(f"\na hanging registry -> the run failed after {took:.1f} s (timeout_s 6): {failed.value}")
    assert recoveries == []
    text = str(failed.value)
    assert f"schema registry http://***@127.0.0.1:{hanging.port} (looking up schema id 1, topic {src!r})" in text
    assert "unavailable for 6 s" in text and "s3cret" not in text
    assert took < 40


def test_a_flow_waiting_for_a_hanging_registry_stops_when_asked(ray_session, kafka_broker, registry, tmp_path):
    """On bc7b6d0 stop() timed out: the event loop that would take it was blocked in the look-up."""
    bs, src, dst, auth, orders = _orders_topic(kafka_broker, registry, 20)
    hanging = FlakyRegistry(registry, hang=True)
    try:
        flow = Flow(f"reg-stop-{src}")
        flow.source(KafkaSource(src, bs, value_format="avro", schema_registry=SchemaRegistry(f"http://127.0.0.1:{hanging.port}")),
                    name="orders").sink(MemorySink("out"))
        flow.dead_letters(MemorySink("dlq"))
        handle = flow.start(parallelism=1, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
        time.sleep(3)
        assert handle.status()["running"]
        began = time.time()
        handle.stop(timeout=30)
        took = time.time() - began
    finally:
        hanging.close()
    print(f"\nstop() with a hanging registry took {took:.1f} s")
    assert took < 20


def test_an_unavailable_registry_is_one_warning_not_one_per_retry(registry, caplog):
    import logging

    flaky = FlakyRegistry(registry, 503, failures=4)
    try:
        auth = SchemaRegistry(registry.url, basic_auth=("flow", "s3cret"))
        raw = RegistryEncoder("avro", auth, "t", ORDER)({"k": "a", "v": 1})
        decode = RegistryDecoder("avro", SchemaRegistry(f"http://flow:s3cret@127.0.0.1:{flaky.port}", timeout_s=30), "t")
        with caplog.at_level(logging.DEBUG, logger="driftstream.engine.connectors.kafka.schema_registry"):
            assert decode(raw) == {"k": "a", "v": 1}
    finally:
        flaky.close()
    levels = [r.levelname for r in caplog.records if r.name.endswith("schema_registry")]
    assert levels == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "INFO"], levels
    assert all("s3cret" not in r.getMessage() for r in caplog.records)
