"""Flame graphs of a run's processes: py-spy samples each one while a benchmark runs.

    with Flames(Path("results/flames-10k"), match="ray::StageActor") as flames:
        ... the run ...
    flames.files   # one SVG per process sampled

    with Flames(Path("results/flames-q5"), match="ray::").follow("q5-"):
        flow.run(...)   # blocks: a thread attaches to the run's processes as they start

The processes are found by their command line (Ray titles its workers ``ray::<Actor>``)
when :meth:`Flames.attach` is called, e.g. once the flow's actors are up; each gets a
``py-spy record --nonblocking`` (it reads the process's memory without pausing it, so
the figures of the run it profiles move little) that writes its SVG when stopped.
Needs ``py-spy`` (in the bench extra) and the right to read other processes' memory
(ptrace: root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional


#: Ray processes that are not the run's: idle pool workers and the node's agents
NOT_THE_RUNS = ("ray::IDLE", "DashboardAgent", "RuntimeEnvAgent")


def processes(match: str, exclude: tuple = NOT_THE_RUNS, within: Optional[int] = None) -> dict:
    """pid -> command line of the processes whose command line contains ``match`` and none of
    ``exclude``, from Linux's /proc; with ``within``, only descendants of that pid (a Ray
    session this process started: not another's on the same machine)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if match in cmdline and not any(x in cmdline for x in exclude) and "py-spy" not in cmdline:
            if within is None or _descends(int(entry), within):
                found[int(entry)] = cmdline
    return found


def _descends(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is among ``pid``'s parents (Linux's /proc)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # ppid, after state
        except (OSError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


class Flames:
    """py-spy recorders over the processes matching ``match``, an SVG per process in ``out``."""

    def __init__(self, out: Path, match: str = "ray::", rate: int = 97, py_spy: Optional[str] = None,
                 fmt: str = "flamegraph", within: Optional[int] = None) -> None:
        # fmt "raw": py-spy's collapsed stacks (a text file per process, one "stack count" a
        # line) for grouping the samples by code (files_basis.step_kind_costs), not an SVG
        self.out, self.match, self.rate, self.fmt, self.within = Path(out), match, rate, fmt, within
        beside = Path(sys.executable).with_name("py-spy")  # a virtualenv's, when it is not on PATH
        self.py_spy = py_spy or shutil.which("py-spy") or (str(beside) if beside.exists() else None)
        self.recorders: dict = {}
        self.files: list = []
        self._following: Optional[threading.Event] = None
        self._lock = threading.Lock()  # follow()'s thread attaches while stop() may be stopping

    def __enter__(self) -> "Flames":
        return self

    def attach(self, label: str = "") -> int:
        """Start recording every matching process not recorded yet; returns how many started."""
        if self.py_spy is None:
            raise RuntimeError("py-spy is not installed: pip install py-spy (the bench extra has it)")
        with self._lock:
            return self._attach(label)

    def _attach(self, label: str) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        started = 0
        for pid, cmdline in processes(self.match, within=self.within).items():
            if pid in self.recorders:
                continue
            title = cmdline.split()[0].replace("ray::", "").replace("/", "_").replace(":", "_")[:60]
            svg = self.out / f"{label}{title}-{pid}.{'txt' if self.fmt == 'raw' else 'svg'}"
            self.recorders[pid] = (subprocess.Popen(
                [self.py_spy, "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking", "--format", self.fmt,
                 "--output", str(svg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), svg)
            started += 1
        return started

    def follow(self, label: str = "", every: float = 0.5) -> "Flames":
        """:meth:`attach` every ``every`` seconds in a thread until :meth:`stop`: for a run that
        blocks its caller (``flow.run``) and starts its processes after the call."""
        stopping = self._following = threading.Event()

        def attach_until_stopped() -> None:
            while not stopping.wait(every):
                self.attach(label)

        threading.Thread(target=attach_until_stopped, name="flames", daemon=True).start()
        return self

    def stop(self) -> list:
        """Stop every recorder; returns the SVGs written."""
        if self._following is not None:
            self._following.set()
            self._following = None
        with self._lock:
            return self._stop()

    def _stop(self) -> list:
        for pid, (proc, svg) in self.recorders.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for pid, (proc, svg) in self.recorders.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if svg.exists():
                self.files.append(svg)
        self.recorders = {}
        return self.files

    def __exit__(self, *exc) -> None:
        self.stop()
