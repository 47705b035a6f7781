"""A Ray cluster of one head node started with ``ray start --head``, as a user starts one.

The test session's own Ray (``ray_session``) is a local instance inside the test
process; a test of what a user does on a cluster (``driftstream start`` from a shell,
Ray Jobs, the Prometheus endpoint) needs a separate cluster, reached by drivers in
subprocesses. Every port it opens is a free one, so it runs beside the session's Ray,
and its files live in a temp dir of its own. Ray 2.60's ``ray start`` turns token
authentication on: :attr:`RayHead.env` is what a driver needs to connect.

>>> with RayHead() as head:                                              # doctest: +SKIP
...     subprocess.run(["driftstream", "list"], env=head.env, check=True)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from driftstream.engine.runtime.ray_session import LEAN_RAY_ENV

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """``ray start --head --block`` in a process group of its own; ``stop()`` ends all of it.

    ``metrics``: Ray's metrics collection on (the session's lean settings turn it off),
    exported every ``metrics_report_ms`` to the Prometheus endpoint at :attr:`metrics_url`.
    ``auth``: token authentication (Ray 2.60's default for ``ray start``) or none.
    """

    def __init__(self, num_cpus: int = 2, metrics: bool = False, metrics_report_ms: int = 1000, auth: bool = True,
                 timeout_s: float = 90.0) -> None:
        self.num_cpus = num_cpus
        self.auth = auth
        self.metrics = metrics
        self.metrics_report_ms = metrics_report_ms
        self.timeout_s = timeout_s
        # Short: Ray's unix socket paths under it must stay below 108 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="dsh-", dir="/tmp")
        self.port = free_port()
        self.dashboard_port = free_port()
        self.metrics_port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def env(self) -> dict:
        """Environment of a driver of this cluster: its address, token authentication, the lean
        settings (metrics collection as the cluster has it)."""
        env = dict(os.environ, **LEAN_RAY_ENV)
        env.update(RAY_ADDRESS=self.address, RAY_AUTH_MODE="token" if self.auth else "disabled")
        env["RAY_enable_metrics_collection"] = "1" if self.metrics else "0"
        return env

    def start(self) -> "RayHead":
        env = self.env
        env.pop("RAY_ADDRESS")
        env["RAY_metrics_report_interval_ms"] = str(self.metrics_report_ms)
        ports = {
            "--port": self.port,
            "--dashboard-port": self.dashboard_port,
            "--metrics-export-port": self.metrics_port,
            "--ray-client-server-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
        }
        cmd = [RAY, "start", "--head", "--block", "--disable-usage-stats", f"--num-cpus={self.num_cpus}",
               "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={self.temp_dir}"]
        cmd += [f"{flag}={port}" for flag, port in ports.items()]
        self.log = open(os.path.join(self.temp_dir, "ray-start.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.timeout_s
        while not self._dashboard_up():
            if self.proc.poll() is not None or time.time() > deadline:
                log = Path(self.log.name).read_text()[-2000:]
                self.stop()
                raise RuntimeError(f"ray start --head did not come up: {log}")
            time.sleep(0.2)
        return self

    def _dashboard_up(self) -> bool:
        """Up once the dashboard answers; any HTTP answer counts (401 without the token)."""
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to ``ray start --block``, which stops the node's processes; SIGKILL to
        what is left of its process group, and to every worker under its temp dir."""
        if self.proc is not None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            subprocess.run(["pkill", "-9", "-f", self.temp_dir], check=False)
            self.proc = None
            self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "RayHead":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
