"""Exactly-once on a Ray cluster that loses a node: a head and two worker nodes on this
machine (``ray.cluster_utils.Cluster``); a worker node hosting actors of the run is removed
mid-stream; the sink's output equals a failure-free run's, element for element and in
order (payloads and Meta).

The cluster runs in a subprocess (``cluster_run.py``): the rest of the suite shares one
local Ray session, and a process is connected to one Ray cluster at a time. The
subprocess gets its own ``RAY_TMPDIR``, so no other ``ray.init()`` on the machine finds
this cluster's address file, and every process of the cluster carries that directory on
its command line: that is how the test checks that none is left behind (a plain
``pgrep -f raylet`` would also see other Ray instances on the machine).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.engine.control.test_exactly_once import failure_free_output

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("cluster_run.py")
TIMEOUT = 240


def processes_with(marker: str) -> list:
    """Pids of the processes whose command line contains ``marker``."""
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(pid))
            except OSError:
                pass
    return pids


def run_cluster(tmp_path: Path, removals: tuple, expected: list) -> tuple:
    """Run ``cluster_run.py`` (``removals``: "graceful", "hard" (the node removed without a
    graceful shutdown), each in a run of its own on the same cluster) against ``expected``, a
    failure-free run's output of its flow (the flow of ``test_exactly_once.py``); checks
    each run and that none of the cluster's processes is left running; returns each
    removal's report and the tail of the script's output."""
    result_path = tmp_path / "result.json"
    expected_path = tmp_path / "expected.pickle"
    expected_path.write_bytes(pickle.dumps(expected))
    ray_tmp = tempfile.mkdtemp(prefix="dsr-", dir="/tmp")  # short: Ray's socket paths live under it
    env = dict(os.environ, RAY_TMPDIR=ray_tmp)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(result_path), str(tmp_path / "work"), f"--expected={expected_path}",
         f"--removals={','.join(removals)}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT * len(removals))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    finally:
        deadline = time.time() + 10
        while processes_with(ray_tmp) and time.time() < deadline:
            time.sleep(0.2)
        leftovers = processes_with(ray_tmp)
        for pid in leftovers:  # this cluster's own processes only (the marker is our temp dir)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)

    tail = "\n".join(output.splitlines()[-40:])
    assert result_path.exists(), f"cluster_run.py wrote no result (exit code {proc.returncode}):\n{tail}"
    result = json.loads(result_path.read_text())
    for mode, report in result["runs"].items():
        print(f"\n{mode}: removed a worker node hosting {report.get('actors_on_removed_node')}: "
              f"{report.get('recoveries')} recoveries {report.get('recovery_s')}, run {report.get('run_s', 0):.1f} s")
    print(f"script {result.get('total_s', 0):.1f} s")
    assert "error" not in result, f"{result['error']}\n--- subprocess output (tail) ---\n{tail}"
    assert list(result["runs"]) == list(removals), result["runs"]
    for report in result["runs"].values():
        assert not report.get("remove_error"), report["remove_error"]
        assert not report.get("not_exercised"), f"SPREAD placed every actor on the head in all attempts: {report['placements']}"
        assert report["actors_on_removed_node"], report
        assert report["recoveries"] >= 1, report
        assert report["got_len"] == report["expected_len"] == report["n"], report
        assert report["equal"], f"first differing element: {report['first_difference']}"
    assert leftovers == [], f"processes of the cluster left running: {leftovers}"
    assert result["leftover_processes"] == []
    return result["runs"], tail


def test_worker_node_removed_mid_stream_then_another_lost_without_shutdown_recovers_in_seconds(ray_session, tmp_path,
                                                                                              tmp_path_factory):
    """One cluster for both removals (each a run of its own; a new worker node replaces the
    first removed one before the second run): starting a cluster costs more than a node.

    Removed gracefully: the run recovers on the other nodes, exactly-once, and the node is gone.

    Then lost without shutdown, its processes killed at once (as when a machine dies): its
    actors' peers see their connections end, the supervisor finds the node's raylet gone, and
    the replacements go to the other nodes, all before Ray's health check (~14 s) declares the
    node dead."""
    runs, tail = run_cluster(tmp_path, ("graceful", "hard"), expected=failure_free_output(tmp_path_factory))
    removed = runs["graceful"]
    assert removed["removed_node"] not in removed["nodes_alive_after"]
    report = runs["hard"]
    # One recovery: a replacement placed on the lost node would fail once Ray declares it
    # dead, and the launch would start over (a second recovery, ~14 s later).
    assert report["recoveries"] == 1, f"{report['recovery_s']}\n{tail}"
    recovery = report["recovery_s"][0]
    assert recovery["first_output_s"] is not None
    print(f"node removed -> detected {recovery['detected_at'] - report['removed_at']:.2f} s, "
          f"-> first new output {recovery['detected_at'] + recovery['first_output_s'] - report['removed_at']:.2f} s")
