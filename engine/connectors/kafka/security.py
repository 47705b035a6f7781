"""KafkaSecurity: how the Kafka connectors reach a secured broker (TLS, SASL), in one frozen value.

The fields are kafka-python's client settings of the same names. One value serves every
client a source or sink opens: kafka-python's consumers, producers and admin clients
(:meth:`KafkaSecurity.client_settings`), and the wire module's own sockets to partition
leaders (:meth:`KafkaSecurity.wrap` for TLS, then :meth:`KafkaSecurity.authenticate`: SaslHandshake
and SaslAuthenticate with kafka-python's own SASL mechanisms, before the first fetch or produce).

Settings travel with the source or sink into its Ray actors (pickled): file paths
(``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``) must name files on every node that
runs the flow's actors, and on the driver, which reads the topics' metadata. Passwords
travel too (Ray's object store holds them while actors start); they never appear in a
``repr()``, an error message, a log line or ``status()``.

>>> sec = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
...                     sasl_plain_username="app", sasl_plain_password="s3cret")
>>> sec
KafkaSecurity(security_protocol='SASL_PLAINTEXT', sasl_mechanism='SCRAM-SHA-512', sasl_plain_username='app', sasl_plain_password='***')
>>> sorted(sec.client_settings())
['sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']
>>> KafkaSecurity(security_protocol="TLS")
Traceback (most recent call last):
...
ValueError: Kafka security_protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, not 'TLS'
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from dataclasses import dataclass, fields
from typing import Any, Optional

import kafka.errors as kafka_errors

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: Version of SaslHandshake (1: the tokens go in SaslAuthenticate requests) and of SaslAuthenticate
#: (1: the answer says how long the session lasts); Kafka 1.0 and later, and Tansu, speak both.
SASL_HANDSHAKE_VERSION, SASL_AUTHENTICATE_VERSION = 1, 1

#: Share of a SASL session's lifetime after which a wire connection is replaced by a new one
#: (authenticated again) rather than used: a broker that enforces the lifetime closes it after.
SESSION_RENEW_AT = 0.8

#: Errors that no retry fixes: refused credentials or mechanism, a certificate that does not
#: verify. A reader or writer raises them at once instead of retrying for its timeout.
REFUSED = (kafka_errors.SaslAuthenticationFailedError, kafka_errors.UnsupportedSaslMechanismError, ssl.SSLCertVerificationError)


class TlsHandshakeTimeout(TimeoutError):
    """The broker accepted the connection but did not answer the TLS handshake in time: a
    plaintext listener waits for the rest of what it takes for a (very large) request."""


class _Hidden:
    """Shown as ``'***'`` by ``repr()``, ``str()`` and f-strings."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"

    def __str__(self) -> str:
        return "***"

    def __format__(self, spec: str) -> str:
        return "***"


class Secret(_Hidden):
    """A password: ``'***'`` wherever it is shown (``repr()``, ``str()``, f-strings, so also
    kafka-python's debug log of its configuration); ``reveal()`` gives it to the library
    that needs it. Not a ``str``: ``json.dumps`` refuses it rather than write it out.

    >>> p = Secret("s3cret")
    >>> repr(p), f"{p}", {"password": p}, p.reveal(), p == Secret("s3cret")
    ("'***'", '***', {'password': '***'}, 's3cret', True)
    >>> import json; json.dumps({"password": p})
    Traceback (most recent call last):
    ...
    TypeError: Object of type Secret is not JSON serializable
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"a password is a str, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """The password itself, for the client library's settings."""
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple:
        return Secret, (self._value,)


@dataclass(frozen=True)
class KafkaSecurity:
    """Client security settings, as kafka-python names them; validated when made (an
    unknown protocol or mechanism, a missing setting or file raises ValueError).

    ``security_protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. ``ssl_*``: the CA
    to verify the broker with (system CAs if None), a client certificate and key (mutual
    TLS) and the key's password, whether the broker's name must match its certificate.
    ``sasl_mechanism``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, with ``sasl_plain_username``
    and ``sasl_plain_password``.
    """

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    ssl_password: Optional[str] = None
    ssl_check_hostname: bool = True
    sasl_mechanism: Optional[str] = None
    sasl_plain_username: Optional[str] = None
    sasl_plain_password: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("ssl_password", "sasl_plain_password"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Secret):
                object.__setattr__(self, name, Secret(value))
        if self.security_protocol not in PROTOCOLS:
            raise ValueError(f"Kafka security_protocol must be one of {', '.join(PROTOCOLS)}, not {self.security_protocol!r}")
        if self.sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ValueError(f"Kafka sasl_mechanism must be one of {', '.join(MECHANISMS)} with {self.security_protocol}, "
                                 f"not {self.sasl_mechanism!r}")
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise ValueError(f"Kafka {self.security_protocol} with {self.sasl_mechanism} needs sasl_plain_username and sasl_plain_password")
        elif self.sasl_mechanism is not None:
            raise ValueError(f"Kafka sasl_mechanism {self.sasl_mechanism!r} needs security_protocol SASL_PLAINTEXT or SASL_SSL, "
                             f"not {self.security_protocol}")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("Kafka ssl_keyfile needs ssl_certfile (the client certificate it belongs to)")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is None:
                continue
            if not self.tls:
                raise ValueError(f"Kafka {name} needs security_protocol SSL or SASL_SSL, not {self.security_protocol}")
            if not os.path.isfile(path):
                raise ValueError(f"Kafka {name} {path!r} is not a file here (it must exist on the driver and on every node)")

    @property
    def tls(self) -> bool:
        """Whether connections are TLS."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        """Whether connections authenticate with SASL."""
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) != f.default]
        return f"KafkaSecurity({', '.join(shown)})"

    def client_settings(self) -> dict:
        """The keyword arguments for kafka-python's KafkaConsumer, KafkaProducer and
        KafkaAdminClient: the settings that differ from kafka-python's defaults."""
        return {f.name: _revealed(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) != f.default}

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context as kafka-python builds one (TLS 1.2 or later)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.ssl_check_hostname  # the chain is verified either way, as in kafka-python
        if self.ssl_cafile:
            ctx.load_verify_locations(self.ssl_cafile)
        else:
            ctx.load_default_certs()
        if self.ssl_certfile:
            ctx.load_cert_chain(certfile=self.ssl_certfile, keyfile=self.ssl_keyfile, password=None if self.ssl_password is None else self.ssl_password.reveal())
        return ctx

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """``sock`` (connected to ``host``) as TLS if the protocol says so, else itself."""
        if not self.tls:
            return sock
        try:
            return self.ssl_context().wrap_socket(sock, server_hostname=host)
        except socket.timeout:
            raise TlsHandshakeTimeout(f"{host}: no answer to the TLS handshake") from None

    def authenticate(self, conn: Any, broker: str) -> Optional[float]:
        """SaslHandshake, then SaslAuthenticate until kafka-python's mechanism is done, on
        ``conn`` (anything with ``request(request, response_class, version)``: one request,
        its answer). Returns when the session should be renewed (``time.monotonic()``), or
        None if it does not expire. Raises SaslAuthenticationFailedError naming ``broker``
        and the user, never the password.
        """
        from kafka.net.sasl import get_sasl_mechanism
        from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse

        who = f"Kafka broker {broker}: SASL {self.sasl_mechanism} as {self.sasl_plain_username!r}"
        began = time.monotonic()
        try:
            answer = conn.request(SaslHandshakeRequest(mechanism=self.sasl_mechanism), SaslHandshakeResponse, SASL_HANDSHAKE_VERSION)
        except ConnectionError:  # Tansu hangs up on a mechanism it does not offer
            raise kafka_errors.UnsupportedSaslMechanismError(f"{who}: the broker closed the connection (mechanism not offered?)") from None
        if answer.error_code:
            error = kafka_errors.for_code(answer.error_code)
            offered = ", ".join(answer.mechanisms or []) or "none"
            raise error(f"{who}: the broker refused the mechanism ({error.__name__}; it offers {offered}; "
                        "a broker without authentication refuses every mechanism)")
        mechanism = get_sasl_mechanism(self.sasl_mechanism)(host=broker.rsplit(":", 1)[0], **self.client_settings())
        lifetime_ms = 0
        while not mechanism.is_done():
            try:
                answer = conn.request(SaslAuthenticateRequest(auth_bytes=mechanism.auth_bytes()), SaslAuthenticateResponse, SASL_AUTHENTICATE_VERSION)
            except ConnectionError:  # Tansu hangs up on credentials it refuses
                raise kafka_errors.SaslAuthenticationFailedError(f"{who} failed: the broker closed the connection (credentials refused)") from None
            if answer.error_code:
                error = kafka_errors.for_code(answer.error_code)
                raise kafka_errors.SaslAuthenticationFailedError(f"{who} failed: {answer.error_message or error.__name__}")
            token = bytes(answer.auth_bytes)
            if token.startswith(b"e="):  # SCRAM's server-final error (RFC 5802): e.g. unknown-user, invalid-proof
                raise kafka_errors.SaslAuthenticationFailedError(f"{who} failed: {token[2:].decode('utf-8', 'replace')}")
            try:
                mechanism.receive(token)
            except (ValueError, KeyError) as exc:  # SCRAM: a malformed answer, or a proof that does not match
                raise kafka_errors.SaslAuthenticationFailedError(f"{who} failed: the broker's answer does not check out ({type(exc).__name__}: {exc})") from None
            lifetime_ms = answer.session_lifetime_ms or 0
        if not mechanism.is_authenticated():
            raise kafka_errors.SaslAuthenticationFailedError(f"{who} failed: the broker did not accept the credentials")
        return began + SESSION_RENEW_AT * lifetime_ms / 1000.0 if lifetime_ms > 0 else None


class _Masked(_Hidden, str):
    """The password as the client library takes it (a ``str``), still ``'***'`` in its logs."""


def _revealed(value: Any) -> Any:
    return _Masked(value.reveal()) if isinstance(value, Secret) else value


def security_of(security: Optional[KafkaSecurity], settings: dict) -> KafkaSecurity:
    """The settings of a source or sink: ``security`` or kafka-python's keyword
    settings (``security_protocol=...``, ...), not both; PLAINTEXT if neither.

    >>> security_of(None, {"security_protocol": "SSL"}).tls
    True
    """
    if security is not None and settings:
        raise ValueError(f"give either security=KafkaSecurity(...) or the settings {sorted(settings)}, not both")
    if security is not None:
        if not isinstance(security, KafkaSecurity):
            raise TypeError(f"security must be a KafkaSecurity, not {type(security).__name__}")
        return security
    known = {f.name for f in fields(KafkaSecurity)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"unknown Kafka client settings {unknown}: the security settings are {sorted(known)}")
    return KafkaSecurity(**settings)


#: No security: plaintext connections.
PLAINTEXT = KafkaSecurity()
