"""Flame graphs of running processes: py-spy attaches to the processes a command line
matches, and each leaves an SVG of where it spent its time."""

from __future__ import annotations

import subprocess
import sys
import time

from driftstream.examples.benchmarks.flames import Flames, processes

BUSY = "import sys, time\ndef spin_here():\n    end = time.time() + 30\n    while time.time() < end: sum(range(1000))\nspin_here()\n"


def test_each_matching_process_gets_a_flame_graph_that_names_its_functions(tmp_path):
    marker = f"flames-test-{time.time_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, marker]) for _ in range(2)]
    try:
        time.sleep(0.5)
        assert len(processes(marker)) == 2
        with Flames(tmp_path / "flames", match=marker) as flames:
            assert flames.attach("t-") == 2
            assert flames.attach("t-") == 0  # each process once
            time.sleep(1.5)
        assert len(flames.files) == 2
        assert all("spin_here" in svg.read_text() for svg in flames.files)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_following_a_run_records_the_processes_it_starts_after_the_call(tmp_path):
    """``follow``: a run that blocks its caller starts its processes later; each one that
    appears before ``stop`` gets its flame graph, and none after."""
    marker = f"flames-follow-{time.time_ns()}"
    procs = []
    try:
        flames = Flames(tmp_path / "flames", match=marker).follow("f-", every=0.1)
        time.sleep(0.3)
        procs.append(subprocess.Popen([sys.executable, "-c", BUSY, marker]))  # started after follow()
        time.sleep(2.0)
        assert len(flames.stop()) == 1
        procs.append(subprocess.Popen([sys.executable, "-c", BUSY, marker]))  # after stop(): not recorded
        time.sleep(0.5)
        assert not flames.recorders and len(flames.files) == 1
        assert "spin_here" in flames.files[0].read_text() and flames.files[0].name.startswith("f-")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_raw_stacks_of_only_the_descendants_of_a_process(tmp_path):
    """``fmt="raw"``: py-spy's collapsed stacks as text; ``within``: a matching process that is
    not a descendant of the given pid (another's on the same machine) is left alone."""
    import os

    marker = f"flames-within-{time.time_ns()}"
    mine = subprocess.Popen([sys.executable, "-c", BUSY, marker])
    # a grandchild of a process that exits at once: re-parented away from this one
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{BUSY}' {marker} >/dev/null 2>&1 &"], check=True)
    try:
        time.sleep(0.5)
        assert len(processes(marker)) == 2
        assert list(processes(marker, within=os.getpid())) == [mine.pid]
        with Flames(tmp_path / "stacks", match=marker, fmt="raw", within=os.getpid()) as flames:
            assert flames.attach("r-") == 1
            time.sleep(1.5)
        assert [f.suffix for f in flames.files] == [".txt"]
        assert any("spin_here" in line and line.rsplit(" ", 1)[1].isdigit() for line in flames.files[0].read_text().splitlines())
    finally:
        mine.kill()
        mine.wait()
        for pid in processes(marker):
            os.kill(pid, 9)
