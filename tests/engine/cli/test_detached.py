"""Detached flows on a cluster started with ``ray start --head``, operated from shells that
come and go: ``driftstream start / list / status / rescale / stop``, a stateful actor killed
between them, ``start --resume`` at another parallelism, Ray Jobs, and Ray's token authentication. Output is checked
record by record: per key, the running sums of a sequential run, each exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, topic_end
from driftstream.engine.connectors.kafka.sink import read_kafka_sink
from driftstream.snapshots.store import SnapshotStore

from tests.engine.cli import kafka_flow
from tests.ray_head import RayHead

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[3]
DRIFTSTREAM = str(Path(sys.executable).with_name("driftstream"))
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def head():
    with RayHead() as h:
        yield h


class Setup:
    """A flow's name, topics and the environment its shells run in."""

    def __init__(self, head: RayHead, bootstrap: str, tmp_path: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name, self.bootstrap = f"ops-{tag}", bootstrap
        self.topic_in, self.topic_out = f"ops-in-{tag}", f"ops-out-{tag}"
        self.snapshots = str(tmp_path / "snaps")
        self.flow_env = {"DS_FLOW": self.name, "DS_BOOTSTRAP": bootstrap, "DS_IN": self.topic_in, "DS_OUT": self.topic_out}
        self.env = dict(head.env, **self.flow_env)
        ensure_topic(bootstrap, self.topic_in, 2)
        ensure_topic(bootstrap, self.topic_out, 3)  # up to 3 instances write it (a rescale)
        self.sent: list = []

    def cli(self, *args: str, env: dict = None, timeout: float = 180) -> subprocess.CompletedProcess:
        """A ``driftstream`` command in a shell of its own, as a user types it."""
        return subprocess.run([DRIFTSTREAM, *args], env=env or self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    def start_args(self, *extra: str) -> list:
        return ["start", "tests.engine.cli.kafka_flow:flow", "-p", "2", "--guarantee", "exactly-once",
                "--snapshot-interval", "0.3", "--snapshot-dir", self.snapshots, *extra]

    def produce(self, n: int) -> None:
        """``n`` records over 5 keys; the key picks the partition, so each key keeps its order."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap)
        for _ in range(n):
            record = {"k": f"k{len(self.sent) % 5}", "v": len(self.sent)}
            producer.send(self.topic_in, key=record["k"].encode(), value=json.dumps(record).encode())
            self.sent.append(record)
        producer.flush()
        producer.close()

    def output(self) -> list:
        return [value for _, value in read_kafka_sink(self.bootstrap, self.topic_out)]

    def written(self) -> int:
        """Records in the output topic (each an output), without reading them: the sum of its
        partitions' true ends (read_kafka_sink waits 300 ms of silence per partition)."""
        c = consumer(self.bootstrap)
        try:
            return topic_end(c, self.topic_out, 3)
        finally:
            c.close()

    def status(self) -> dict:
        done = self.cli("status", self.name, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["status"]

    def wait_for(self, what: str, check, timeout: float = 120.0):
        deadline = time.time() + timeout
        while True:
            value = check()
            if value:
                return value
            assert time.time() < deadline, f"{what} did not happen within {timeout} s"
            time.sleep(0.5)

    def assert_output_exactly_once(self) -> None:
        self.wait_for("all the output", lambda: self.written() >= len(self.sent))
        got: dict = {}
        for value in self.output():
            got.setdefault(value["k"], []).append(value["sum"])
        assert got == kafka_flow.expected(self.sent)  # nothing lost, nothing twice, per-key order kept


def stateful_actor(setup: Setup, index: int) -> str:
    """The Ray name of the actor running instance ``index`` of the ``sums`` step."""
    os.environ.update(setup.flow_env)
    try:
        plan = kafka_flow.flow().plan(2)
    finally:
        for k in setup.flow_env:
            os.environ.pop(k)
    stage = next(s for s in plan.stages if "sums" in s.steps)
    return stage.actor_names[index]


def test_started_by_a_ray_job_then_listed_watched_killed_rescaled_stopped_and_resumed_from_shells(head, kafka_broker, tmp_path):
    """One detached flow for every claim (each start of one costs a driver and its actors):
    started by a Ray job, it goes on once the job has ended; shells that are none of the
    flow's list it, watch it, kill a stateful actor of it, rescale it, stop it and resume it."""
    s = Setup(head, kafka_broker.bootstrap_servers, tmp_path)
    s.produce(300)
    # The job's driver runs on the cluster, in the cluster's environment: the flow's settings and
    # this checkout (where the flow's module is) go with the job's runtime environment.
    runtime_env = {"env_vars": dict(s.flow_env, PYTHONPATH=str(ROOT))}
    submitted = subprocess.run(
        [RAY, "job", "submit", "--address", head.dashboard_url, "--runtime-env-json", json.dumps(runtime_env), "--",
         DRIFTSTREAM, *s.start_args()],
        env=s.env, cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert submitted.returncode == 0 and f"started flow '{s.name}'" in submitted.stdout, submitted.stdout + submitted.stderr
    s.produce(300)  # the job has ended; the flow goes on (its output is checked at the end)

    listed = s.cli("list")
    assert listed.returncode == 0 and any(line.split()[:2] == [s.name, "running"] for line in listed.stdout.splitlines()), listed.stdout
    s.wait_for("output and a committed snapshot", lambda: s.written() >= 100 and SnapshotStore(s.snapshots).read_latest_manifest())
    view = s.cli("status", s.name, "--interval", "0.5")
    assert view.returncode == 0 and f"flow {s.name}: running" in view.stdout and "snapshots:" in view.stdout, view.stdout + view.stderr

    # A stateful actor dies, from a shell that is none of the flow's.
    victim = stateful_actor(s, 0)
    code = f"import ray; ray.init(); ray.kill(ray.get_actor({victim!r}, namespace='driftstream'), no_restart=True)"
    killed = subprocess.run([sys.executable, "-c", code], env=s.env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == 0, killed.stderr
    s.produce(300)
    s.wait_for("a recovery", lambda: len(s.status()["recoveries"]) >= 1)

    # From 2 to 3 instances while it runs; the status view shows who owns which key groups.
    rescaled = s.cli("rescale", s.name, "-p", "3")
    assert rescaled.returncode == 0 and f"flow '{s.name}' rescaled from 2 to 3 instances" in rescaled.stdout, rescaled.stderr
    s.produce(300)
    view = s.cli("status", s.name, "--interval", "0.5")
    assert "key groups (128) per instance: " in view.stdout and "0-42 43-85 86-127" in view.stdout, view.stdout
    assert "rescaled 2 -> 3" in view.stdout, view.stdout

    stopped = s.cli("stop", s.name)
    assert stopped.returncode == 0 and f"stopped flow '{s.name}'" in stopped.stdout, stopped.stderr
    assert s.name not in s.cli("list").stdout  # stop frees the name for the resume

    s.produce(300)  # while nothing runs: the resumed flow reads it from where the final snapshot left off
    resumed = s.cli(*s.start_args("--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"started flow '{s.name}'" in resumed.stdout  # and the shell that started it is gone
    s.assert_output_exactly_once()
    assert s.cli("stop", s.name).returncode == 0


def test_a_driver_without_the_clusters_token_is_told_what_to_export(head, tmp_path):
    env = {k: v for k, v in head.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token
    # Ray's driver tries its GCS connection RAY_NUM_REDIS_GET_RETRIES times (default 20), a second
    # apart, before it gives up with the last error, here the cluster's refusal: 2 tries suffice.
    refused = dict(env, RAY_NUM_REDIS_GET_RETRIES="2")
    done = subprocess.run([DRIFTSTREAM, "list", "--address", head.address], env=refused, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2
    assert "export RAY_AUTH_MODE=token" in done.stderr and "ray get-auth-token" in done.stderr, done.stderr
    # With the token at hand the same command connects (token mode turned on by itself).
    assert subprocess.run([DRIFTSTREAM, "list", "--address", head.address], env=dict(env, HOME=os.path.expanduser("~")),
                          capture_output=True, text=True, timeout=180).returncode == 0


def test_no_cluster_fails_at_once_with_what_to_do(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    done = subprocess.run([DRIFTSTREAM, "list", "--address", "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "ray start --head" in done.stderr, done.stderr
    assert time.time() - t0 < 60


def test_a_detached_flow_with_a_large_plan_is_restarted_after_the_starting_shell_is_gone(head, tmp_path):
    """live_clicks' plan is 2.7 MB (its clicks). As the coordinator's constructor argument it
    went to the object store, owned by the `driftstream start` process; once that exited, Ray
    could not restart the coordinator, and a killed one took the flow with it (Ray said so on
    start: "core_worker.cc: ... constructor arguments in the object store and max_restarts >
    0"). The plan is now kept in the cluster's key-value store (control/stored_plan.py)."""
    env = dict(head.env, TMPDIR=str(tmp_path))  # live_clicks writes its counts under $TMPDIR

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([DRIFTSTREAM, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)

    def described() -> dict:
        done = cli("status", "live-clicks", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else {}

    started = cli("start", "driftstream.examples.live_clicks:flow", "-p", "1", "--guarantee", "exactly-once",
                  "--snapshot-interval", "0.5", "--snapshot-dir", str(tmp_path / "snaps"))
    assert started.returncode == 0, started.stderr
    assert "object store" not in started.stderr and "core_worker" not in started.stderr, started.stderr
    deadline = time.time() + 120
    while not described().get("status", {}).get("snapshots"):
        assert time.time() < deadline, "no snapshot within 120 s"
        time.sleep(0.5)
    code = "import ray; ray.init(); ray.kill(ray.get_actor('live-clicks/coordinator', namespace='driftstream'), no_restart=False)"
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == 0, killed.stderr
    deadline = time.time() + 120
    while described().get("flow", {}).get("restarts") != 1 or described()["flow"]["state"] != "running":
        assert time.time() < deadline, f"the coordinator was not restarted within 120 s: {cli('list').stdout}"
        time.sleep(0.5)
    stopped = cli("stop", "live-clicks")
    assert stopped.returncode == 0 and "stopped flow 'live-clicks'" in stopped.stdout, stopped.stderr
