"""Exactly-once when a whole Ray node goes away: a helper run in its own process.

``python cluster_run.py RESULT.json [WORKDIR] [--removals=graceful,hard] [--expected=OUTPUT.pickle]`` starts a Ray
cluster of a head and two worker nodes on this machine (``ray.cluster_utils.Cluster``), runs the
pipeline of ``test_exactly_once.py`` once without failures (MemorySource; or takes that run's
sink content, pickled, from ``--expected``: the test passes the one its session already has) and
for each removal of ``--removals`` (default: graceful) in turn, paced under exactly-once,
while a background thread removes a worker node that hosts at least one of the run's
actors (Ray's SPREAD is best-effort: if every actor landed on the head, nothing is removed
and the run is repeated); a new worker node takes the removed one's place before the next
run. It writes what it saw to RESULT.json. ``hard`` removes the node without letting its
processes shut down gracefully (SIGKILL, as when a machine dies). The cluster is always shut
down. ``test_cluster.py`` runs this
script and asserts on the JSON; it runs in a subprocess because the test suite
shares one local Ray session (tests/conftest.py) and a process can only be
connected to one Ray cluster.

The cluster lives under its own short ``RAY_TMPDIR`` (made by ``main`` unless
the caller set one): ``Cluster`` writes its address to
``$RAY_TMPDIR/ray/ray_current_cluster``, and with the default ``/tmp/ray`` any
other process on the machine calling ``ray.init()`` without an address while
this runs would connect to this cluster instead of starting its own. Every
process of the cluster has that directory on its command line, so the leftover
check below (and the test's) finds exactly this cluster's processes.

Which node an actor is on is read from the GCS actor table
(``ray._private.state.actors``): the public state API (``ray.util.state``)
needs the dashboard, which the lean settings leave out.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Optional

from driftstream.engine.runtime.ray_session import LEAN_RAY_ENV, NAMESPACE

for _k, _v in LEAN_RAY_ENV.items():
    os.environ.setdefault(_k, _v)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink  # noqa: E402
from driftstream.engine import Flow  # noqa: E402
from driftstream.engine.testing import MemorySource, PacedSource  # noqa: E402

N = 6000  # elements; paced at RATE elements/s the run takes N / RATE seconds without failures
RATE = 1500
PARALLELISM = 2
SNAPSHOT_INTERVAL = 0.3
REMOVE_AFTER = 1.5  # seconds after every actor of the run is up
ATTEMPTS = 3  # runs until one has an actor on a worker node (see main)


def checksum(state, x):  # order-sensitive: a rolling hash of the key's history
    new = ((state or 0) * 31 + x[1]) % 1_000_003
    return new, [x[0], x[1], new]


def build(name: str, sink, paced: bool) -> Flow:
    items = [("k%d" % (i % 7), i) for i in range(N)]
    source = PacedSource(items, rate=RATE, partitions=3) if paced else MemorySource(items, partitions=3)
    flow = Flow(name)
    flow.source(source, name="src").key_by(lambda x: x[0], name="by_key").stateful_map(checksum, name="sum").sink(sink)
    return flow


def actor_names(flow: Flow) -> list:
    plan = flow.plan(PARALLELISM)
    return [f"{plan.flow_name}/acker"] + [n for s in plan.stages for n in s.actor_names]


def actor_node(name: str) -> str:
    """Node id of the live actor named ``name`` (ValueError while it does not exist)."""
    handle = ray.get_actor(name, namespace=NAMESPACE)
    info = ray._private.state.actors(handle._actor_id.hex())
    if info.get("State") != "ALIVE":
        raise ValueError(f"{name} is {info.get('State')}")
    return info["Address"]["NodeID"]


def placement(names: list) -> dict:
    """``{actor name: node id}`` of the actors that are alive now."""
    out = {}
    for name in names:
        try:
            out[name] = actor_node(name)
        except Exception:
            pass
    return out


def leftover_processes(marker: str) -> list:
    """``"pid cmdline"`` of every process (but this one) whose command line contains ``marker``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if marker in cmd:
            out.append(f"{pid} {cmd[:200]}")
    return out


def remover(cluster: Cluster, workers: list, names: list, report: dict, deadline: float, graceful: bool) -> threading.Thread:
    """Once every actor of the run is alive, wait REMOVE_AFTER seconds, then remove the worker
    node that hosts the most of them (never the head: the driver is connected to it)."""

    def run():
        try:
            while time.time() < deadline:
                where = placement(names)
                if len(where) == len(names):
                    break
                time.sleep(0.05)
            else:
                report["remove_error"] = f"the run's actors never all came up: {sorted(placement(names))}"
                return
            time.sleep(REMOVE_AFTER)
            where = placement(names)
            report["placement_before"] = where
            by_node = {w.node_id: [n for n, nid in where.items() if nid == w.node_id] for w in workers}
            victim = max(workers, key=lambda w: len(by_node[w.node_id]))
            if not by_node[victim.node_id]:
                report["not_exercised"] = True  # SPREAD is best-effort: all on the head; main tries again
                return
            report["removed_node"] = victim.node_id
            report["actors_on_removed_node"] = sorted(by_node[victim.node_id])
            report["removed_at"] = time.time()
            cluster.remove_node(victim, allow_graceful=graceful)
            report["remove_s"] = time.time() - report["removed_at"]
        except Exception:
            report["remove_error"] = traceback.format_exc()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def removal_run(cluster: Cluster, workers: list, workdir: str, expected: list, graceful: bool, report: dict) -> None:
    """A paced exactly-once run of ``build``'s flow while :func:`remover` takes a worker node
    of ``workers`` out (``graceful``: with a shutdown of its processes, else SIGKILL), against
    ``expected``: what the run saw. Ray's SPREAD is best-effort: if no worker node got an
    actor of the run, nothing is removed, and the run is repeated (under another name) up to
    ATTEMPTS times. What it saw goes into ``report``."""
    mode = "graceful" if graceful else "hard"
    report.update(n=N, rate=RATE, parallelism=PARALLELISM, graceful=graceful, placements=[])
    for attempt in range(ATTEMPTS):
        name = f"cl-{mode}{attempt}"
        out = os.path.join(workdir, name)
        flow = build(name, FileSink(out, name="out"), paced=True)
        report.pop("not_exercised", None)
        thread = remover(cluster, workers, actor_names(flow), report, deadline=time.time() + 60, graceful=graceful)
        t = time.time()
        try:
            result = flow.run(
                parallelism=PARALLELISM,
                guarantee="exactly-once",
                snapshot_interval=SNAPSHOT_INTERVAL,
                snapshot_dir=os.path.join(workdir, name + "-snaps"),
                timeout=150,
            )
        finally:
            report["run_s"] = time.time() - t
            thread.join(timeout=30)
            report["placements"].append(report.get("placement_before"))
        if not report.get("not_exercised"):
            break
    report["attempts"] = attempt + 1
    got = read_file_sink(out, "out")
    report.update(
        recoveries=result.metrics.recoveries,
        recovery_s=result.metrics.recovery_s,
        snapshots=result.metrics.snapshots,
        expected_len=len(expected),
        got_len=len(got),
        equal=got == expected,
        first_difference=next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None),
        nodes_alive_after=sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
    )


def main(result_path: str, workdir: str, removals: tuple = ("graceful",), expected_path: Optional[str] = None) -> int:
    """One cluster for each removal in ``removals`` ("graceful", "hard") in turn: before each
    after the first, a new worker node takes the removed one's place (starting a node costs
    less than starting a cluster). RESULT.json holds ``runs``: each removal's report."""
    own_tmpdir = "RAY_TMPDIR" not in os.environ
    if own_tmpdir:  # short: Ray's unix socket paths live under it (limit ~107 characters)
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="dsr-", dir="/tmp")
    ray_tmpdir = os.environ["RAY_TMPDIR"]
    report: dict = {"removals": list(removals), "ray_tmpdir": ray_tmpdir, "runs": {}}
    t0 = time.time()
    cluster = None
    try:
        store = 128 * 1024 * 1024  # per node; Ray's default (30% of RAM each) is far more than this needs
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": store})
        workers = [cluster.add_node(num_cpus=1, object_store_memory=store) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, configure_logging=False)
        report["nodes"] = {"head": cluster.head_node.node_id, "workers": [w.node_id for w in workers]}
        report["cluster_up_s"] = time.time() - t0

        # Failure-free reference: given (the same flow's output from the test session), or run on this cluster.
        t = time.time()
        if expected_path:
            with open(expected_path, "rb") as f:
                expected = pickle.load(f)
        else:
            build("cl-ref", FileSink(os.path.join(workdir, "ref"), name="out"), paced=False).run(parallelism=PARALLELISM)
            expected = read_file_sink(os.path.join(workdir, "ref"), "out")
        report["reference_s"] = time.time() - t

        for mode in removals:
            if report["runs"]:  # two worker nodes again: a new one in the removed one's place
                removed = list(report["runs"].values())[-1].get("removed_node")
                workers = [w for w in workers if w.node_id != removed]
                while len(workers) < 2:
                    workers.append(cluster.add_node(num_cpus=1, object_store_memory=store))
                cluster.wait_for_nodes()
            report["runs"][mode] = {}  # filled as the run goes: what it saw stays, should it raise
            removal_run(cluster, workers, workdir, expected, mode == "graceful", report["runs"][mode])
    except BaseException:
        report["error"] = traceback.format_exc()
    finally:
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()
        report["total_s"] = time.time() - t0
        deadline = time.time() + 10  # workers exit on their own once their raylet is gone
        while leftover_processes(ray_tmpdir) and time.time() < deadline:
            time.sleep(0.2)
        report["leftover_processes"] = leftover_processes(ray_tmpdir)
        if own_tmpdir and not report["leftover_processes"]:
            shutil.rmtree(ray_tmpdir, ignore_errors=True)
        with open(result_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        summary = ("attempts", "recoveries", "equal", "got_len", "actors_on_removed_node", "run_s")
        runs = {mode: {k: run.get(k) for k in summary} for mode, run in report["runs"].items()}
        print("cluster_run:", json.dumps({"runs": runs, "total_s": report["total_s"], "leftover_processes": report["leftover_processes"]},
                                         default=str), flush=True)
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    removals = tuple(next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--removals=")), "graceful").split(","))
    expected_path = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--expected=")), None)
    if len(args) > 1:
        sys.exit(main(args[0], args[1], removals, expected_path))
    with tempfile.TemporaryDirectory(prefix="driftstream-cluster-") as d:
        sys.exit(main(args[0], d, removals, expected_path))
