"""Running a PyFlink job as a subprocess of driftstream's venv: what the Flink baselines
share (:mod:`.inverted_index.flink_baseline`, :mod:`.nexmark.flink_queries`).

apache-flink 2.3 pins py4j, and through apache-beam pyarrow<17, numpy<2.2, pandas<2.3 and
protobuf<6: it would downgrade driftstream's dependencies, so it lives in an interpreter of
its own (:func:`flink_python`). The driver (this venv) writes the input files, starts the
job module under that interpreter (:class:`FlinkJob`: its own process group, the mini
cluster's JVM and any Python workers included, killed on every path) and reads the job's
exactly-once output as the file sink commits it (:class:`PartFiles`).

Install (in the checkout, where :func:`flink_python` finds it)::

    python3 -m venv .venv-flink
    .venv-flink/bin/pip install apache-flink==2.3.0
    .venv-flink/bin/pip install --no-deps -e .

>>> sorted(job_settings("/tmp/ckp", 0.5, 2))[:3]
['execution.checkpointing.dir', 'execution.checkpointing.interval', 'execution.checkpointing.mode']
>>> job_settings("/tmp/ckp", 0.5, 2, extra=["parallelism.default=4"])["parallelism.default"]
'4'
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

FLINK_PYTHON_ENV = "DRIFTSTREAM_FLINK_PYTHON"
#: Where the setup above puts Flink's interpreter: a venv of its own beside the checkout's.
FLINK_VENV = Path(__file__).resolve().parents[1] / ".venv-flink"
#: How often a driver lists the job's output directory.
POLL_INTERVAL = 0.01


def interpreter_with(module: str, python: Optional[str], env: str, venv: Path, install: str) -> str:
    """The interpreter that runs a job needing ``module``: ``python``, else this one if it has
    the module, else ``$env``, else ``venv``'s; RuntimeError naming ``install`` when there is
    none. Shared by every baseline kept out of driftstream's install (Flink, Bytewax).

    >>> interpreter_with("json", None, "NO_SUCH_VARIABLE", Path("/nowhere"), "pip install it") == sys.executable
    True
    """
    if python:
        return python
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    if os.environ.get(env):
        return os.environ[env]
    if (venv / "bin" / "python").exists():
        return str(venv / "bin" / "python")
    raise RuntimeError(f"no Python with {module}: {install} (in the checkout), or set {env} to a Python that has {module}")


def flink_python(python: Optional[str] = None) -> str:
    """The interpreter that runs a Flink job (see :func:`interpreter_with`)."""
    return interpreter_with(
        "pyflink", python, FLINK_PYTHON_ENV, FLINK_VENV,
        "apache-flink downgrades driftstream's dependencies, so it gets a venv of its own: python3 -m venv .venv-flink && "
        ".venv-flink/bin/pip install apache-flink==2.3.0 && .venv-flink/bin/pip install --no-deps -e .",
    )


# ------------------------------------------------------------------ the job's side (runs under pyflink)


def job_settings(
    checkpoint_dir: str,
    checkpoint_interval: float,
    parallelism: int,
    state_backend: str = "hashmap",
    extra: Sequence[str] = (),
    **more: str,
) -> dict:
    """The Flink options every baseline runs with: streaming, exactly-once checkpoints every
    ``checkpoint_interval`` s into ``checkpoint_dir``, no restarts; then ``more`` (option
    names with ``_`` for ``.``, or a dict's ``**``) and ``extra`` ``KEY=VALUE`` overrides."""
    settings = {
        # A failure ends the run instead of restarting forever (the benchmarks measure failure-free runs).
        "restart-strategy.type": "none",
        "execution.runtime-mode": "STREAMING",
        "execution.checkpointing.interval": f"{max(10, round(checkpoint_interval * 1000))} ms",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": Path(checkpoint_dir).resolve().as_uri(),
        "state.backend.type": state_backend,
        "parallelism.default": str(parallelism),
    }
    if state_backend == "rocksdb":
        settings["execution.checkpointing.incremental"] = "true"
    settings.update(more)
    for kv in extra:  # KEY=VALUE Flink options (measurements)
        k, v = kv.split("=", 1)
        settings[k] = v
    return settings


def die_with_parent() -> None:
    """Kill the job's process group (this process, the JVM, its workers) if the driver dies without stopping it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


# ------------------------------------------------------------------ the driver's side (no pyflink needed)


class FlinkJob:
    """``python -m module job *args`` in its own process group (JVM and Python workers
    included), its output in ``workdir/job.log``; ``stop`` kills the group."""

    def __init__(self, python: str, workdir: Path, module: str, args: list[str]) -> None:
        self.log = open(workdir / "job.log", "wb")
        cmd = [python, "-m", module, "job", *args]
        self.launched = time.time()
        # The JVM's log goes to the run's directory (by default it is pyflink's own, shared by every run).
        env = {**os.environ, "FLINK_LOG_DIR": str(workdir / "log")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self._cpu: dict[int, float] = {}
        self._cpu_sampled = 0.0

    def sample_cpu(self, every: float = 0.5) -> None:
        """Record the CPU seconds of every process in the job's group (JVM, Python workers): the load-independent cost."""
        now = time.time()
        if now - self._cpu_sampled < every:
            return
        self._cpu_sampled = now
        tick = os.sysconf("SC_CLK_TCK")
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # fields[2]: pgrp (after pid, comm, state)
                # utime + stime + cutime + cstime: children that exited are counted too
                self._cpu[int(d)] = max(self._cpu.get(int(d), 0.0), sum(int(x) for x in fields[11:15]) / tick)

    @property
    def cpu_seconds(self) -> float:
        return round(sum(self._cpu.values()), 1)

    def running(self) -> bool:
        return self.proc.poll() is None

    def watch(self, poll: Callable[[], object], until: Callable[[], bool], deadline: float) -> None:
        """Call ``poll`` (and sample the CPU) every ``POLL_INTERVAL`` s while the job runs, until ``until()`` or ``deadline``."""
        while self.running() and not until() and time.time() < deadline:
            poll()
            self.sample_cpu()
            time.sleep(POLL_INTERVAL)
        poll()

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL whatever is left (the JVM ignores SIGINT, workers may linger)."""
        self.running()
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + grace
            while time.time() < deadline and _group_alive(self.proc.pid):
                self.proc.poll()
                time.sleep(0.05)
            if not _group_alive(self.proc.pid):
                break
        self.proc.wait()
        self.log.close()

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes()[-n:].decode(errors="replace")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class PartFiles:
    """The JSON-lines records of a file sink's finished part files, as they appear.

    A finished part file is complete: the sink writes under a hidden in-progress name and
    renames it in when the checkpoint that covers it commits (Flink's exactly-once output).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> out = PartFiles(d)
    >>> _ = (d / ".part-0.inprogress").write_text('{"a": 1}\\n')
    >>> out.poll(), out.first_output is not None
    ([], True)
    >>> _ = (d / "part-0").write_text('{"a": 1}\\n{"a": 2}\\n')
    >>> out.poll(), out.poll()
    ([{'a': 1}, {'a': 2}], [])
    """

    def __init__(self, directory: Path, parse: Callable[[bytes], Any] = json.loads) -> None:
        self.directory = Path(directory)
        self.parse = parse  # of each line (bytes)
        self.seen: set = set()
        self.first_output: Optional[float] = None  # when the first file of any kind (in-progress included) was seen

    def poll(self) -> list:
        """The records of the part files finished since the last call."""
        now = time.time()
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        records = []
        for e in entries:
            if self.first_output is None:
                self.first_output = now
            if e.name.startswith((".", "_")) or e.name in self.seen or not e.is_file():
                continue
            self.seen.add(e.name)
            with open(e.path, "rb") as f:
                records += [self.parse(line.rstrip(b"\n")) for line in f if line.strip()]
        return records


class Scheduled:
    """Hands ``items`` (each a tuple ending with its ``due``) over from a thread, each ``due`` s
    after :meth:`start` (or as soon as it can when late), by :meth:`deliver`; ``handed[i]``:
    when item ``i`` had gone. :meth:`finish` runs after the last."""

    def __init__(self, items: Sequence[tuple], name: str) -> None:
        self.items = list(items)
        self.handed: list[Optional[float]] = [None] * len(self.items)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def deliver(self, i: int, item: tuple) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the last item (nothing by default)."""

    def _run(self) -> None:
        start = time.time()
        for i, item in enumerate(self.items):
            delay = start + item[-1] - time.time()
            if delay > 0 and self._stop.wait(delay):
                return
            self.deliver(i, item)
            self.handed[i] = time.time()
        self.finish()

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class Feeder(Scheduled):
    """Renames ``files`` ``(name, text, due)`` into ``directory`` at their due times;
    ``renamed[i]``: when file ``i`` went in.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> f = Feeder(d, [("a.json", "1\\n", 0.0), ("b.json", "2\\n", 0.01)])
    >>> f.start(); f.join(); sorted(os.listdir(d)), all(f.renamed)
    (['a.json', 'b.json'], True)
    """

    def __init__(self, directory: Path, files: Sequence[tuple]) -> None:
        super().__init__(files, "flink-feeder")
        self.directory = Path(directory)
        self.renamed = self.handed

    def deliver(self, i: int, item: tuple) -> None:
        name, text, _ = item
        hidden = self.directory / f".{name}.tmp"
        hidden.write_text(text)
        os.rename(hidden, self.directory / name)  # atomic: the source never lists a half-written file


def feed_when_warm(job: FlinkJob, poll: Callable[[], object], warm: Callable[[], bool], done: Callable[[], bool],
                   feeder: Feeder, warmup_timeout: float, feed_timeout: float) -> tuple[list, Optional[float]]:
    """A latency run's course: wait until the job's warm-up output is out (``warm()``: JVM
    start, planning and the first checkpoint are then behind it), start ``feeder``, watch
    until ``done()``; stop the feeder and the job on every path. Returns the problems and
    the seconds from launch to warm (None when it never was)."""
    problems: list = []
    ready = None
    try:
        job.watch(poll, warm, time.time() + warmup_timeout)
        if not warm():
            problems.append(f"warm-up output not out after {time.time() - job.launched:.0f} s: {job.tail()}")
        else:
            ready = time.time() - job.launched
            feeder.start()
            job.watch(poll, done, time.time() + feed_timeout)
            if not job.running():
                problems.append(f"job ended ({job.proc.returncode}): {job.tail()}")
    finally:
        feeder.stop()
        job.stop()
    return problems, ready
