"""The Kafka connectors against secured brokers, for real.

Tansu 0.6.0 cannot be the TLS or SASL end itself: its ``--cert`` and ``--key`` exclude each
other (no TLS), and with ``--authentication`` it offers SCRAM only, with users it creates only
for an already authenticated client, so on its in-memory storage no client gets in. So TLS
and SCRAM are done by a listener in front of a plain Tansu (``SecuredProxy``, which Tansu
advertises): a flow over SASL_SSL with a stateful actor killed, exactly once; a flow over
SSL; refusals (plaintext against TLS, a foreign CA, a wrong password) at once and clearly,
without the password; SASL sessions renewed before they run out. Tansu's own
``--authentication`` runs the SCRAM exchange and refuses: that refusal is tested too."""

from __future__ import annotations

import datetime
import json
import logging
import ssl
import time
import uuid

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaConnectionError, SaslAuthenticationFailedError, UnsupportedSaslMechanismError

from driftstream.engine import Flow
from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, read_partition
from driftstream.engine.connectors.kafka.security import KafkaSecurity
from driftstream.engine.connectors.kafka.sink import KafkaSink, read_kafka_sink
from driftstream.engine.connectors.kafka.source import TICK_HEADER, KafkaSource
from driftstream.engine.connectors.kafka.wire import TopicFetcher
from driftstream.engine.connectors.local_kafka import free_port, start_local_kafka
from driftstream.engine.testing import MemorySink, wait_for_actor
from tests.engine.connectors.kafka.broker_proxy import SecuredProxy
from tests.engine.connectors.kafka.test_kafka import expected_sums, running_sum

pytestmark = pytest.mark.ray

KEY_PASSWORD = "key-pass-" + uuid.uuid4().hex[:6]
SASL_PASSWORD = "sasl-pass-" + uuid.uuid4().hex[:6]


def _write_certs(d) -> dict:
    """A CA, a server certificate for 127.0.0.1 signed by it, a client certificate whose key is
    encrypted with KEY_PASSWORD, and a second CA that signed nothing here."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(name, key, issuer_name, issuer_key, ca, san=None):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(name, data):
        path = d / name
        path.write_bytes(data)
        return str(path)

    pem = serialization.Encoding.PEM
    paths = {}
    for ca_name in ("ca", "other_ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"driftstream test {ca_name}")])
        ca_cert = cert(f"driftstream test {ca_name}", ca_key, ca_subject, ca_key, True)
        paths[ca_name] = write(f"{ca_name}.pem", ca_cert.public_bytes(pem))
        if ca_name == "ca":
            signer = (ca_subject, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = cert("localhost", server_key, *signer, False, [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths["server_cert"] = write("server.pem", server.public_bytes(pem))
    paths["server_key"] = write("server.key", server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    client_key = ec.generate_private_key(ec.SECP256R1())
    paths["client_cert"] = write("client.pem", cert("driftstream client", client_key, *signer, False).public_bytes(pem))
    paths["client_key"] = write("client.key", client_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(KEY_PASSWORD.encode())))
    return paths


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return _write_certs(tmp_path_factory.mktemp("certs"))


def _secured_broker(certs, **proxy_settings):
    """A plain Tansu behind a SecuredProxy (TLS with the test's server certificate), which it
    advertises: ``(broker, proxy)``."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs["server_cert"], certs["server_key"])
    port = free_port()
    broker = start_local_kafka(advertised_port=port)
    return broker, SecuredProxy(broker.port, server, port=port, **proxy_settings)


def _security(certs, **settings) -> KafkaSecurity:
    """TLS trusting the test's CA, with the client certificate (its key encrypted)."""
    return KafkaSecurity(ssl_cafile=certs["ca"], ssl_certfile=certs["client_cert"], ssl_keyfile=certs["client_key"],
                         ssl_password=KEY_PASSWORD, **settings)


@pytest.fixture(scope="module")
def tls_broker(certs):
    """``(bootstrap servers, security)`` of Tansu behind a TLS listener."""
    broker, proxy = _secured_broker(certs)
    yield f"127.0.0.1:{proxy.port}", _security(certs, security_protocol="SSL")
    proxy.close()
    broker.stop()


@pytest.fixture(scope="module")
def sasl_broker(certs):
    """``(bootstrap servers, security, proxy)`` of Tansu behind a TLS listener that requires
    SCRAM-SHA-512 authentication as alice."""
    broker, proxy = _secured_broker(certs, scram_users={"alice": SASL_PASSWORD})
    security = _security(certs, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                         sasl_plain_password=SASL_PASSWORD)
    yield f"127.0.0.1:{proxy.port}", security, proxy
    proxy.close()
    broker.stop()


@pytest.fixture(scope="module")
def auth_broker():
    """Tansu requiring SASL authentication, on plain TCP."""
    broker = start_local_kafka(authentication=True)
    yield broker.bootstrap_servers
    broker.stop()


def _times_from_log(bs: str, security: KafkaSecurity, topic: str, partitions: int) -> list:
    """``(time, doc)`` of every record of ``topic`` as the source stamps it: the running maximum
    of the partition's timestamps (tick records included), source 0, partition, offset."""
    c = consumer(bs, security)
    docs = []
    try:
        for p in range(partitions):
            ts = None
            for rec in read_partition(c, TopicPartition(topic, p), 0):
                ts = rec.timestamp if ts is None else max(ts, rec.timestamp)
                if not any(k == TICK_HEADER for k, _ in rec.headers or ()):
                    docs.append(((ts, 0, p, rec.offset), json.loads(rec.value)))
    finally:
        c.close()
    return docs


def _produce(bs: str, security: KafkaSecurity, topic: str, docs: list) -> None:
    p = KafkaProducer(bootstrap_servers=bs, **security.client_settings())
    for i, doc in enumerate(docs):
        p.send(topic, json.dumps(doc).encode(), partition=i % 2)
    p.flush()
    p.close()


def _whole(read, n: int, deadline: float) -> list:
    """``read()``, repeated until it returns at least ``n`` items or ``deadline`` passes."""
    got = read()
    while len(got) < n and time.time() < deadline:
        time.sleep(0.1)
        got = read()
    return got


def _wait(what, deadline: float, status=None):
    while not what():
        assert time.time() < deadline, status() if status else "timed out"
        time.sleep(0.05)


def test_a_flow_over_sasl_ssl_is_exactly_once_with_a_stateful_actor_killed(ray_session, sasl_broker, tmp_path, caplog):
    """Input, output, ticks, metadata: every byte goes through the TLS listener, on
    connections authenticated with SCRAM (Tansu advertises only the listener). Half the
    input is there before the kill, half comes after it."""
    import ray

    bs, security, proxy = sasl_broker
    tag = uuid.uuid4().hex[:8]
    src, dst, name = f"tls-in-{tag}", f"tls-out-{tag}", f"tls-{tag}"
    ensure_topic(bs, src, 2, security)
    docs = [{"k": "abcde"[i % 5], "v": i} for i in range(1200)]
    _produce(bs, security, src, docs[:600])
    flow = Flow(name)
    flow.source(KafkaSource(src, bs, security=security), name="in").key_by(lambda d: d["k"], name="by_key").stateful_map(
        running_sum, name="sum").sink(KafkaSink(dst, bs, security=security))
    assert KEY_PASSWORD not in flow.plan(parallelism=2).describe()
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    try:
        deadline = time.time() + 60
        _wait(lambda: handle.status()["snapshots"], deadline, handle.status)
        ray.kill(wait_for_actor(f"{name}/by_key/0", timeout=30), no_restart=True)
        _produce(bs, security, src, docs[600:])
        _wait(lambda: handle.status()["recoveries"], deadline, handle.status)
        _wait(lambda: len(read_kafka_sink(bs, dst, security=security)) >= len(docs), deadline, handle.status)
        status = handle.status()
    finally:
        handle.stop(timeout=60)
    # A read ends after 0.3 s without records: on a busy machine, a first fetch (TLS handshakes
    # included) can take longer, so each read is repeated until it is whole.
    deadline = time.time() + 30
    timed = _whole(lambda: _times_from_log(bs, security, src, 2), len(docs), deadline)
    out = _whole(lambda: read_kafka_sink(bs, dst, security=security), len(docs), deadline)
    assert [v for _, v in out] == expected_sums(timed)  # each once, in time order, after the kill
    assert [tuple(m)[:4] for m, _ in out] == sorted(t for t, _ in timed)
    assert status["recoveries"]
    assert proxy.authentications > 10 and proxy.refused == 0  # the fetchers, writers, kafka-python's clients
    for secret in (KEY_PASSWORD, SASL_PASSWORD):
        assert secret not in json.dumps(status, default=str)
        assert secret not in caplog.text  # kafka-python logs its configuration at DEBUG


def test_a_flow_over_tls_reads_and_writes(tls_broker):
    bs, security = tls_broker
    tag = uuid.uuid4().hex[:8]
    src, dst = f"ssl-in-{tag}", f"ssl-out-{tag}"
    ensure_topic(bs, src, 2, security)
    docs = [{"k": "ab"[i % 2], "v": i} for i in range(100)]
    _produce(bs, security, src, docs)
    flow = Flow("ssl")
    flow.source(KafkaSource(src, bs, bounded=True, security=security)).map(lambda d: d["v"] * 2).sink(KafkaSink(dst, bs, security=security))
    flow.run(runtime="simulator", parallelism=2)
    out = _whole(lambda: read_kafka_sink(bs, dst, security=security), len(docs), time.time() + 30)
    assert sorted(v for _, v in out) == [2 * i for i in range(100)]


def test_a_wrong_password_fails_at_once_naming_broker_and_user(sasl_broker):
    bs, security, proxy = sasl_broker
    wrong = "wrong-" + uuid.uuid4().hex[:6]
    settings = {**security.client_settings(), "sasl_plain_password": wrong}
    began, refused_before = time.monotonic(), proxy.refused
    with pytest.raises(SaslAuthenticationFailedError) as refused:
        KafkaSource("anything", bs, **settings).partitions()
    assert time.monotonic() - began < 10 and proxy.refused == refused_before + 1
    assert str(refused.value).endswith(f"Kafka broker {bs}: SASL SCRAM-SHA-512 as 'alice' failed: "
                                       "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512")
    assert wrong not in repr(refused.value) and SASL_PASSWORD not in repr(refused.value)


def test_a_sasl_session_is_renewed_before_the_broker_ends_it(certs):
    """The listener cuts each connection when its session (1 s) ends: a fetcher that did not
    open a new, authenticated connection before then would lose its connection each second."""
    broker, proxy = _secured_broker(certs, scram_users={"alice": SASL_PASSWORD}, session_lifetime_ms=1000)
    bs = f"127.0.0.1:{proxy.port}"
    security = _security(certs, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                         sasl_plain_password=SASL_PASSWORD)
    try:
        ensure_topic(bs, "renewed", 1, security)
        fetcher = TopicFetcher(bs, "renewed", [0], security=security, max_wait_ms=50)
        before = proxy.authentications
        ends = time.monotonic() + 2.6
        while time.monotonic() < ends:
            fetcher.fetch({0: 0})
        fetcher.close()
        assert proxy.authentications - before >= 4  # opened, then renewed at 0.8, 1.6 and 2.4 s
        assert proxy.cut == 0
    finally:
        proxy.close()
        broker.stop()


def test_a_plaintext_client_against_the_tls_listener_fails_at_once_and_says_why(tls_broker):
    bs, _ = tls_broker
    began = time.monotonic()
    flow = Flow("plain-vs-tls")
    flow.source(KafkaSource("anything", bs)).sink(MemorySink("out"))
    with pytest.raises(KafkaConnectionError, match=f"{bs} hung up .* 'PLAINTEXT': a TLS listener needs security_protocol 'SSL'"):
        flow.run(runtime="simulator")
    with pytest.raises(KafkaConnectionError, match="a TLS listener needs"):
        KafkaSink("anything", bs).open(0, 1)
    assert time.monotonic() - began < 10  # kafka-python alone retries for 30 s, then cannot say why


def test_a_tls_client_against_a_plaintext_listener_is_told_so(kafka_broker, certs):
    """Tansu takes the TLS hello for the start of a huge request and waits for the rest."""
    began = time.monotonic()
    with pytest.raises(KafkaConnectionError, match="did not answer the TLS handshake within 5 s: a plaintext listener needs"):
        KafkaSink("anything", kafka_broker.bootstrap_servers, security_protocol="SSL", ssl_cafile=certs["ca"]).open(0, 1)
    assert time.monotonic() - began < 10


def test_a_broker_certificate_from_another_ca_is_refused_at_once(tls_broker, certs):
    bs, _ = tls_broker
    began = time.monotonic()
    with pytest.raises(KafkaConnectionError, match=f"TLS with Kafka broker {bs} failed .*CERTIFICATE_VERIFY_FAILED"):
        KafkaSource("anything", bs, security_protocol="SSL", ssl_cafile=certs["other_ca"]).partitions()
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_credentials_the_broker_refuses_fail_at_once_naming_broker_and_user(auth_broker, mechanism, caplog):
    """Tansu runs the SCRAM exchange (SaslHandshake accepted, the client-first message
    answered) and refuses the unknown user: the source and the sink fail with that, not
    after retrying, and the password is nowhere."""
    security = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_plain_username="alice",
                             sasl_plain_password=SASL_PASSWORD)
    source, sink = KafkaSource("t", auth_broker, security=security), KafkaSink("t", auth_broker, security=security)
    began = time.monotonic()
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(SaslAuthenticationFailedError) as refused:
            source.partitions()
        with pytest.raises(SaslAuthenticationFailedError):
            sink.open(0, 1)
    assert time.monotonic() - began < 10
    assert str(refused.value).endswith(f"Kafka broker {auth_broker}: SASL {mechanism} as 'alice' failed: unknown-user")
    for shown in (str(refused.value), repr(source), repr(sink), repr(security), caplog.text):
        assert SASL_PASSWORD not in shown
    assert "sasl_plain_password='***'" in repr(source)


def test_a_mechanism_the_broker_does_not_offer_fails_at_once(auth_broker):
    security = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_plain_username="u", sasl_plain_password=SASL_PASSWORD)
    with pytest.raises(UnsupportedSaslMechanismError, match=f"Kafka broker {auth_broker}: SASL PLAIN as 'u'") as refused:
        KafkaSource("t", auth_broker, security=security).partitions()
    assert SASL_PASSWORD not in str(refused.value)


def test_a_plaintext_client_against_a_broker_that_requires_authentication_is_told_so(auth_broker):
    with pytest.raises(KafkaConnectionError, match="one that requires authentication 'SASL_PLAINTEXT' or 'SASL_SSL'"):
        KafkaSource("t", auth_broker).partitions()
