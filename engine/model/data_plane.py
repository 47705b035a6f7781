"""The data plane's credentials: a run's secret, and optionally TLS for its connections.

Actors of one run talk over TCP (:mod:`driftstream.engine.runtime.transport`). Each
connection opens with a challenge-response on the run's secret (the secret itself
never crosses the wire, :mod:`driftstream.engine.runtime.handshake`); with
``DataPlaneTLS`` the connections are TLS as well, both sides presenting a certificate
signed by the given CA (as Flink's internal SSL), so that nobody on the network reads
or alters the batches.

>>> key = PlaneKey.new()
>>> len(key.secret), key.tls is None
(32, True)
>>> "secret" in repr(key) and key.secret.hex() not in repr(key)    # never printed
True
"""

from __future__ import annotations

import os
import secrets
import ssl
from dataclasses import dataclass, field
from typing import Optional

from driftstream.engine.model.errors import FlowError


@dataclass(frozen=True)
class DataPlaneTLS:
    """PEM files, readable by every node's actors at the same paths: ``ca`` signs every
    node's certificate, ``cert`` and ``key`` are the certificate this node presents (one
    certificate for every node is enough: peers check the CA's signature, not a host
    name, since actors talk by IP address).

    >>> DataPlaneTLS("/nonexistent/ca.pem", "c.pem", "k.pem").check()
    Traceback (most recent call last):
    ...
    driftstream.engine.model.errors.FlowError: data_plane_tls: ca file /nonexistent/ca.pem is not readable; give PEM files every node can read at the same path
    """

    ca: str
    cert: str
    key: str

    def check(self) -> None:
        """FlowError naming the first file that cannot be read. O(files)."""
        for what, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            if not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise FlowError(f"data_plane_tls: {what} file {path} is not readable; give PEM files every node can read at the same path")

    def server_context(self) -> ssl.SSLContext:
        """The listening side: presents ``cert``, requires a client certificate from ``ca``."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The connecting side: presents ``cert``, checks the server's against ``ca``."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # peers are addressed by IP; the CA's signature is the check
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca)
        return ctx


@dataclass(frozen=True)
class PlaneKey:
    """What an actor needs to join a run's data plane: the run's secret (new per launch)
    and the TLS files, if any."""

    secret: bytes = field(repr=False)
    tls: Optional[DataPlaneTLS] = None

    @classmethod
    def new(cls, tls: Optional[DataPlaneTLS] = None) -> "PlaneKey":
        """A fresh 32-byte secret."""
        return cls(secrets.token_bytes(32), tls)

    def __repr__(self) -> str:
        return f"PlaneKey(secret=<{len(self.secret)} bytes>, tls={self.tls!r})"
