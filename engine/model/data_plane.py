"""The data plane's credentials: a run's secret, and optionally TLS for its connections.

Actors of one run talk over TCP (:mod:`driftstream.engine.runtime.transport`). Each
connection opens with a challenge-response on the run's secret (the secret itself
never crosses the wire, :mod:`driftstream.engine.runtime.handshake`); with
``DataPlaneTLS`` the connections are TLS as well, both sides presenting a certificate
signed by the given CA (as Flink's internal SSL), so that nobody on the network reads
or alters the batches.

The secret does not cross Ray either: Ray's calls (actor creation, ``reset``) travel
on Ray's gRPC, plaintext unless the cluster runs Ray's own TLS (``RAY_USE_TLS``), and
Ray keeps an actor's creation arguments in its control store. What a :class:`PlaneKey`
carries there is a fresh public nonce per launch; every actor derives the launch's
secret from the nonce and the *key file* on its own node (HMAC-SHA256 under the
file's bytes). The launch creates the file on its node when it is missing (32 random
bytes, 0600, in this user's private directory): enough on one machine, or where the
nodes share the home directory. On other clusters ``data_plane_key`` names a file of
at least 32 secret bytes at the same path on every node (the TLS key PEM will do).

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "plane.key")
>>> _create_key_file(path)                                         # as a launch does for its default file
>>> key = PlaneKey.new(key_file=path)
>>> len(key.secret), key.tls is None, oct(os.stat(path).st_mode & 0o777)
(32, True, '0o600')
>>> "secret" in repr(key) and key.secret.hex() not in repr(key)    # never printed
True
>>> import pickle
>>> sent = pickle.dumps(key)                                       # what crosses Ray
>>> key.secret in sent, pickle.loads(sent).secret == key.secret    # derived again on arrival
(False, True)
>>> PlaneKey.new(key_file=path).secret != key.secret                # a new secret per launch
True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import ssl
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
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


#: The name of the key file in this user's private data directory, when ``data_plane_key`` is None.
KEY_FILE_NAME = "data-plane.key"

#: Bytes a key file holds at least.
KEY_BYTES = 32


class PlaneKey:
    """What an actor needs to join a run's data plane: the run's secret (new per launch)
    and the TLS files, if any.

    A key made by :meth:`new` pickles to its public part only (the launch's ``nonce``, the
    key file's path and a ``check`` of the derived secret); the receiving actor derives
    the secret again from its node's key file (:attr:`secret`). ``PlaneKey(secret)`` holds
    a secret in this process only (tests) and refuses to be pickled.
    """

    def __init__(self, secret: Optional[bytes] = None, tls: Optional[DataPlaneTLS] = None, *, nonce: bytes = b"",
                 key_file: Optional[str] = None, check: bytes = b"") -> None:
        self.tls = tls
        self.nonce = nonce
        self.key_file = key_file
        self.check = check
        self._secret = secret

    @classmethod
    def new(cls, tls: Optional[DataPlaneTLS] = None, key_file: Optional[str] = None) -> "PlaneKey":
        """A fresh launch's key: a new nonce under ``key_file`` (None: this user's default,
        created on this node if missing). FlowError if the file cannot be used. O(1)."""
        path = key_file or str(_default_key_file())
        if key_file is None:
            _create_key_file(path)
        nonce = secrets.token_bytes(16)
        secret = _derive(_read_key_file(path), nonce)
        return cls(secret, tls, nonce=nonce, key_file=path, check=_check_of(secret))

    @property
    def secret(self) -> bytes:
        """The launch's 32-byte secret: given, or derived from the key file on this node
        (read once). FlowError naming the file and the node if it is missing, unsafe, or
        not the file the launch used."""
        if self._secret is None:
            if self.key_file is None:
                raise FlowError("data plane: a PlaneKey without a secret or key file; make it with PlaneKey.new")
            secret = _derive(_read_key_file(self.key_file), self.nonce)
            if not hmac.compare_digest(_check_of(secret), self.check):
                raise FlowError(f"data plane: the key file {self.key_file} on node {_node()} is not the one the run was launched "
                                "with: give data_plane_key, a file with the same secret bytes at the same path on every node")
            self._secret = secret
        return self._secret

    def __reduce__(self) -> tuple:
        if self.key_file is None:
            raise TypeError("a PlaneKey holding its secret in this process is never sent: make it with PlaneKey.new")
        return _rebuild, (self.tls, self.nonce, self.key_file, self.check)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlaneKey) and (self.tls, self.nonce, self.key_file, self.check) == (
            other.tls, other.nonce, other.key_file, other.check) and (self.key_file is not None or self._secret == other._secret)

    def __hash__(self) -> int:
        return hash((self.nonce, self.key_file, self.check))

    def __repr__(self) -> str:
        return f"PlaneKey(secret=<derived from {self.key_file}>, tls={self.tls!r})" if self.key_file else \
            f"PlaneKey(secret=<{len(self._secret or b'')} bytes>, tls={self.tls!r})"


def _rebuild(tls: Optional[DataPlaneTLS], nonce: bytes, key_file: str, check: bytes) -> PlaneKey:
    return PlaneKey(None, tls, nonce=nonce, key_file=key_file, check=check)


def _derive(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, b"driftstream data plane|" + nonce, hashlib.sha256).digest()


def _check_of(secret: bytes) -> bytes:
    """A public tag of ``secret`` (a MAC under it): tells a node with another key file apart."""
    return hmac.new(secret, b"check", hashlib.sha256).digest()[:8]


def _default_key_file() -> Path:
    from driftstream.engine.model.private_dir import data_dir

    return data_dir() / KEY_FILE_NAME


def _create_key_file(path: str) -> None:
    """Write ``KEY_BYTES`` random bytes to ``path`` (0600) unless it exists. Atomic: the
    bytes go to a temporary file that is then linked in place, so a concurrent launch
    reads a whole key or makes its own link fail and reads this one."""
    if os.path.exists(path):
        return
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".data-plane-key-")
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another launch made it first: use theirs
    finally:
        os.unlink(tmp)


def _read_key_file(path: str) -> bytes:
    """The key file's bytes; FlowError naming the file, the node and what to do unless it
    is a regular file of this user that others can neither read nor write, of at least
    ``KEY_BYTES`` bytes."""
    where = f"data plane: key file {path} on node {_node()}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise FlowError(f"{where} does not exist: on a cluster whose nodes do not share this home directory, give data_plane_key, "
                        f"a file of at least {KEY_BYTES} secret bytes at the same path on every node") from None
    except OSError as exc:
        raise FlowError(f"{where} cannot be read ({exc.strerror}): give data_plane_key, a file this user can read") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXO | stat.S_IWGRP):
            raise FlowError(f"{where} must be a regular file of this user that others can neither read nor write "
                            f"(mode {oct(stat.S_IMODE(st.st_mode))}): chmod 600 it")
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    if len(data) < KEY_BYTES:
        raise FlowError(f"{where} holds {len(data)} bytes, fewer than {KEY_BYTES}: fill it with random bytes "
                        f"(head -c {KEY_BYTES} /dev/urandom)")
    return data


def _node() -> str:
    import socket

    return socket.gethostname()
