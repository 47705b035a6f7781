"""KafkaSecurity as a value: validation when made, secrets hidden when shown and kept when
pickled (into Ray actors), kafka-python's settings out. No broker here: see test_secured_kafka."""

from __future__ import annotations

import json

import pickle

import pytest
from ray import cloudpickle  # what Ray pickles actors' arguments with

from driftstream.engine.connectors.kafka.security import PLAINTEXT, KafkaSecurity, Secret, security_of
from driftstream.engine.connectors.kafka.sink import KafkaSink
from driftstream.engine.connectors.kafka.source import KafkaSource

SCRAM = dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="app", sasl_plain_password="pw-123")


@pytest.mark.parametrize("settings, message", [
    (dict(security_protocol="sasl_ssl"), "security_protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, not 'sasl_ssl'"),
    (dict(security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_plain_username="a", sasl_plain_password="b"),
     "sasl_mechanism must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 with SASL_SSL, not 'GSSAPI'"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN"), "needs sasl_plain_username and sasl_plain_password"),
    (dict(sasl_mechanism="PLAIN"), "needs security_protocol SASL_PLAINTEXT or SASL_SSL, not PLAINTEXT"),
    (dict(security_protocol="SSL", ssl_cafile="/no/such/ca.pem"), "ssl_cafile '/no/such/ca.pem' is not a file here"),
    (dict(ssl_cafile=__file__), "ssl_cafile needs security_protocol SSL or SASL_SSL"),
    (dict(security_protocol="SSL", ssl_keyfile=__file__), "ssl_keyfile needs ssl_certfile"),
])
def test_settings_that_cannot_work_are_refused_when_made(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        KafkaSecurity(**settings)


def test_passwords_never_show_and_survive_pickling():
    sec = KafkaSecurity(**SCRAM)
    source, sink = KafkaSource("t", "h:1", security=sec), KafkaSink("t", "h:1", **SCRAM)
    for shown in (repr(sec), repr(source), repr(sink), str(sec.sasl_plain_password), f"{sec.sasl_plain_password}",
                  repr(sec.client_settings())):
        assert "pw-123" not in shown
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(source)).security
        assert back == sec and type(back.sasl_plain_password) is Secret
        assert back.sasl_plain_password.reveal() == "pw-123"
    settings = back.client_settings()  # what kafka-python's SCRAM and PLAIN take: a str, masked in its logs
    assert settings["sasl_plain_password"].encode() == b"pw-123" and "pw-123" not in repr(settings)
    with pytest.raises(TypeError):  # not a str: json.dumps refuses it rather than write it out
        json.dumps({"password": back.sasl_plain_password})


def test_kafka_python_gets_only_what_differs_from_its_defaults():
    assert PLAINTEXT.client_settings() == {}
    assert KafkaSecurity(**SCRAM).client_settings() == SCRAM
    assert KafkaSecurity(security_protocol="SSL", ssl_check_hostname=False).client_settings() == {
        "security_protocol": "SSL", "ssl_check_hostname": False}


def test_a_source_takes_a_security_value_or_the_settings_not_both():
    assert KafkaSource("t", "h:1", **SCRAM).security == KafkaSecurity(**SCRAM)
    assert KafkaSource("t", "h:1").security == PLAINTEXT
    with pytest.raises(ValueError, match="not both"):
        security_of(KafkaSecurity(**SCRAM), {"security_protocol": "SSL"})
    with pytest.raises(TypeError, match=r"unknown Kafka client settings \['sasl_password'\]"):
        KafkaSink("t", "h:1", sasl_password="x")
