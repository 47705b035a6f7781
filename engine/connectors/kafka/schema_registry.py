"""Avro, JSON Schema and Protobuf values under a schema registry, in Confluent's wire format
(a zero magic byte, the schema's 4-byte id, then the encoded value), through
``confluent-kafka``'s serializers (``fastavro`` for Avro): any Confluent-compatible
registry (Confluent, Redpanda, Apicurio's ccompat API, Karapace).

>>> registry = SchemaRegistry("http://registry:8081", basic_auth=("user", "s3cret"))
>>> registry
SchemaRegistry('http://registry:8081', basic_auth=('user', '***'))
>>> KafkaSource("orders", servers, value_format="avro", schema_registry=registry)       # doctest: +SKIP
>>> KafkaSink("totals", servers, value_format="avro", schema=TOTALS_AVSC,                 # doctest: +SKIP
...           schema_registry=registry, subject_name_strategy="record")

A source looks up each record's writer schema by its id (cached per process); a record
that is not in the wire format or does not decode becomes a dead letter. A sink registers
its schema once per process (``auto.register.schemas``), under the subject its
``subject_name_strategy`` names: ``"topic"`` (``<topic>-value``, the default),
``"record"`` (the record's full name) or ``"topic-record"``. Protobuf takes the
generated message class instead of a schema text (``protobuf_message=``).

The serializers hold an HTTP client, which does not cross processes: the encoder and
decoder objects here are pickled to the actors without it and build it on first use.

A registry that is unavailable is not a record's fault: a call that times out
(``call_timeout_s``, 5 s), cannot connect, or is answered 408, 429 or 5xx is retried with
backoff for up to ``timeout_s`` (60 s), then :class:`RegistryUnavailable` fails the run,
naming the registry (its URL's userinfo masked) and the schema id or subject; refused
credentials (401, 403) fail it at once. A source looks schemas up in its fetcher thread,
never in the actor's event loop, so a hanging registry does not stall its heartbeats.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from driftstream.engine.connectors.kafka.security import Secret
from driftstream.engine.model.errors import FlowError

log = logging.getLogger(__name__)

#: HTTP statuses of a registry that is busy or failing, not of a bad request: retried.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

#: First and longest pause between two tries of a registry call that failed transiently.
RETRY_PAUSE_S, RETRY_PAUSE_MAX_S = 0.1, 2.0

#: value formats a schema registry serves
FORMATS = ("avro", "json-schema", "protobuf")

#: subject name strategies, as confluent-kafka names its functions
SUBJECT_NAME_STRATEGIES = {
    "topic": "topic_subject_name_strategy",
    "record": "record_subject_name_strategy",
    "topic-record": "topic_record_subject_name_strategy",
}


def mask_url(url: str) -> str:
    """``url`` with its userinfo (``user:password@``) shown as ``***@``.

    >>> mask_url("https://flow:s3cret@registry:8081/x"), mask_url("http://registry:8081")
    ('https://***@registry:8081/x', 'http://registry:8081')
    """
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#]*@", r"\1***@", url)


@dataclass(frozen=True)
class SchemaRegistry:
    """Where the registry is (``url``), and its credentials: ``basic_auth=(user, password)``
    (the password kept as a :class:`.Secret`). ``call_timeout_s``: how long one HTTP call
    may take; ``timeout_s``: how long calls that time out, cannot connect or are answered
    408, 429 or 5xx are retried (with backoff) before the run fails."""

    url: str
    basic_auth: Optional[tuple] = None
    timeout_s: float = 60.0
    call_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise FlowError(f"a schema registry's url is http(s)://host:port, not {self.url!r}")
        if self.basic_auth is not None:
            user, password = self.basic_auth
            object.__setattr__(self, "basic_auth", (user, password if isinstance(password, Secret) else Secret(password)))

    def client(self) -> Any:
        """A ``confluent_kafka`` SchemaRegistryClient (one per process: it holds connections)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        # Retries are ours (_Serde.call_patiently): the client's own would wait up to 20 s a try.
        conf: dict = {"url": self.url, "timeout": self.call_timeout_s, "max.retries": 0}
        if self.basic_auth is not None:
            conf["basic.auth.user.info"] = f"{self.basic_auth[0]}:{self.basic_auth[1].reveal()}"
        return SchemaRegistryClient(conf)

    @property
    def masked_url(self) -> str:
        """The URL as errors and logs show it (userinfo masked)."""
        return mask_url(self.url)

    def masked(self, text: str) -> str:
        """``text`` (an error's) with the URL's userinfo masked wherever it appears."""
        userinfo = self.url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
        return text.replace(userinfo + "@", "***@") if userinfo else text

    def __repr__(self) -> str:
        auth = "" if self.basic_auth is None else f", basic_auth=({self.basic_auth[0]!r}, '***')"
        return f"SchemaRegistry({self.masked_url!r}{auth})"


def registry_of(value: Union[str, SchemaRegistry, None], what: str) -> SchemaRegistry:
    if isinstance(value, SchemaRegistry):
        return value
    if isinstance(value, str):
        return SchemaRegistry(value)
    raise FlowError(f"{what} needs schema_registry= (a URL or a SchemaRegistry) for its registry format")


def check_format(fmt: str, what: str, schema: Optional[str], protobuf_message: Optional[type], writing: bool) -> None:
    """FlowError, when the flow is built, for a format that lacks what it needs."""
    if fmt == "protobuf" and protobuf_message is None:
        raise FlowError(f"{what}: value_format='protobuf' needs protobuf_message= (the generated message class)")
    if writing and fmt in ("avro", "json-schema") and not schema:
        raise FlowError(f"{what}: value_format={fmt!r} writes with a schema: give schema= (the schema's JSON text)")
    try:
        import confluent_kafka.schema_registry  # noqa: F401
        if fmt == "avro":
            import fastavro  # noqa: F401
    except ImportError as exc:
        raise FlowError(f"{what}: value_format={fmt!r} needs confluent-kafka's schema registry support: "
                        "pip install 'confluent-kafka[avro,schemaregistry,json,protobuf]' (driftstream[registry])") from exc


class RegistryUnavailable(RuntimeError):
    """The registry refused or did not answer (credentials, an outage): not the record's
    fault, so not a dead letter. ``transient``: worth another try (a timeout, no connection,
    408, 429, 5xx), which :meth:`_Serde.call_patiently` makes until its deadline; else
    (credentials, or the deadline passed) the run fails with it."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class _Serde:
    """What the encoder and the decoder share: the format, the registry, the topic, and a
    serializer built lazily in the process that uses it."""

    def __init__(self, fmt: str, registry: SchemaRegistry, topic: str) -> None:
        self.fmt, self.registry, self.topic = fmt, registry, topic
        self._serde: Optional[Callable] = None
        self._context: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_serde": None, "_context": None}

    def _call(self, value: Any, what: str) -> Any:
        """One try; :class:`RegistryUnavailable` for the registry's failures, the serializer's
        own error for the value's (a dead letter, or an element that does not fit)."""
        if self._serde is None:
            from confluent_kafka.serialization import MessageField, SerializationContext

            self._serde = self._build(self.registry.client())
            self._context = SerializationContext(self.topic, MessageField.VALUE)
        try:
            return self._serde(value, self._context)
        except Exception as exc:
            status = getattr(exc, "http_status_code", None)
            transient = (status is not None and (status in TRANSIENT_STATUSES or status >= 500 or status < 0)
                         or isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore")))
            if transient or status in (401, 403):
                raise RegistryUnavailable(f"schema registry {self.registry.masked_url} ({what}, topic {self.topic!r}): "
                                          f"{self.registry.masked(f'{type(exc).__name__}: {exc}')}", transient) from exc
            raise

    def call_patiently(self, value: Any, what: str, stop: Optional[threading.Event] = None) -> Any:
        """:meth:`_call`, tried again after transient failures with backoff for up to the
        registry's ``timeout_s``; then (or once ``stop`` is set) RegistryUnavailable."""
        registry = self.registry
        deadline, pause, failures = time.monotonic() + registry.timeout_s, RETRY_PAUSE_S, 0
        while True:
            try:
                got = self._call(value, what)
                if failures:
                    log.info("schema registry %s answers again (%s), after %d retries", registry.masked_url, what, failures)
                return got
            except RegistryUnavailable as exc:
                if not exc.transient:
                    raise
                if time.monotonic() + pause > deadline or (stop is not None and stop.is_set()):
                    raise RegistryUnavailable(f"{exc}; unavailable for {registry.timeout_s:g} s (SchemaRegistry timeout_s, each call "
                                              f"{registry.call_timeout_s:g} s): check the registry, then resume the flow") from exc
                failures += 1  # one WARNING per outage, each further attempt at DEBUG
                if failures == 1:
                    log.warning("%s; retrying for up to %g s (SchemaRegistry timeout_s)", exc, registry.timeout_s)
                else:
                    log.debug("%s; retrying in %.1f s", exc, pause)
                if stop is not None:
                    stop.wait(pause)
                else:
                    time.sleep(pause)
                pause = min(RETRY_PAUSE_MAX_S, pause * 2)

    def _build(self, client: Any) -> Callable:
        raise NotImplementedError


class RegistryDecoder(_Serde):
    """A KafkaSource's ``value_format`` for a registry format: wire-format bytes -> a dict
    (Avro, JSON Schema) or a message (Protobuf). Raises on anything else (a dead letter)."""

    def __init__(self, fmt: str, registry: SchemaRegistry, topic: str, protobuf_message: Optional[type] = None) -> None:
        super().__init__(fmt, registry, topic)
        self.protobuf_message = protobuf_message

    def __call__(self, raw: bytes, stop: Optional[threading.Event] = None) -> Any:
        """The value ``raw`` holds; blocks while the registry is retried (``stop`` ends the
        wait), so a source calls it off its event loop (``KafkaPartitionReader``)."""
        if not raw or raw[0] != 0:
            raise ValueError(f"not in the schema registry's wire format (magic byte {raw[:1]!r}, expected b'\\x00')")
        return self.call_patiently(raw, f"looking up schema id {int.from_bytes(raw[1:5], 'big')}", stop)

    def _build(self, client: Any) -> Callable:
        if self.fmt == "avro":
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            return AvroDeserializer(client)
        if self.fmt == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            return JSONDeserializer(None, schema_registry_client=client)
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        return ProtobufDeserializer(self.protobuf_message, {"use.deprecated.format": False})


class RegistryEncoder(_Serde):
    """A KafkaSink's ``encode`` for a registry format: a dict (or a message) -> wire-format
    bytes, its schema registered once under the strategy's subject."""

    def __init__(self, fmt: str, registry: SchemaRegistry, topic: str, schema: Optional[str] = None,
                 subject_name_strategy: str = "topic", protobuf_message: Optional[type] = None) -> None:
        if subject_name_strategy not in SUBJECT_NAME_STRATEGIES:
            raise FlowError(f"subject_name_strategy is one of {', '.join(map(repr, SUBJECT_NAME_STRATEGIES))}, not {subject_name_strategy!r}")
        super().__init__(fmt, registry, topic)
        self.schema, self.strategy, self.protobuf_message = schema, subject_name_strategy, protobuf_message
        self._gave_up: Optional[tuple] = None  # (monotonic time, RegistryUnavailable)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_gave_up": None}

    def __call__(self, value: Any) -> bytes:
        """Wire-format bytes; in a sink's writer thread, so a wait for the registry holds only
        that sink. For ``timeout_s`` after its patience ran out, calls raise the same at once
        (a sink that tries the elements one by one after a failure would wait as long for each)."""
        if self._gave_up is not None and time.monotonic() - self._gave_up[0] < self.registry.timeout_s:
            raise self._gave_up[1]
        subject = f"subject {self.topic}-value" if self.strategy == "topic" else f"subject strategy {self.strategy!r}"
        try:
            return self.call_patiently(value, f"registering the schema, {subject}")
        except RegistryUnavailable as exc:
            self._gave_up = (time.monotonic(), exc)
            raise

    def _build(self, client: Any) -> Callable:
        import confluent_kafka.schema_registry as registry_module

        conf = {"auto.register.schemas": True, "subject.name.strategy": getattr(registry_module, SUBJECT_NAME_STRATEGIES[self.strategy])}
        if self.fmt == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            return AvroSerializer(client, self.schema, conf=conf)
        if self.fmt == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            return JSONSerializer(self.schema, client, conf=conf)
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        return ProtobufSerializer(self.protobuf_message, client, conf={**conf, "use.deprecated.format": False})
