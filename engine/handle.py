"""``FlowHandle``: a running flow, for unbounded sources.

>>> handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps")   # doctest: +SKIP
>>> handle.status()["watermark"]                                                              # doctest: +SKIP
>>> handle.stop()          # final snapshot, then shut down; returns the RunResult            # doctest: +SKIP
>>> flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps", resume=True)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Optional

from .result import RunResult


class FlowHandle:
    """Runs the supervisor's loop in a background thread of the driver."""

    def __init__(self, supervisor, started_ray: bool) -> None:
        self.supervisor = supervisor
        self._started_ray = started_ray
        self._result: Optional[RunResult] = None
        self._error: Optional[BaseException] = None
        self._launched = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"driftstream-{supervisor.plan.flow_name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self.supervisor.run(on_launched=self._launched.set)
        except BaseException as exc:  # handed to wait()
            self._error = exc
        finally:
            self._launched.set()
            self.supervisor.shutdown()
            if self._started_ray:
                import ray

                ray.shutdown()

    def status(self) -> dict:
        """Watermark, elements emitted and released, dead letters, the last snapshot (T, duration)
        and every recovery (detected at, seconds to restored and to first new output)."""
        self._launched.wait()
        if not self._thread.is_alive():
            return {"running": False, "error": None if self._error is None else str(self._error)}
        return dict(self.supervisor.live_status(), running=True)

    def stop(self, timeout: Optional[float] = None) -> RunResult:
        """Take a final snapshot, shut every actor down, and return what the run released."""
        self.supervisor.stop_requested.set()
        return self.wait(timeout)

    def wait(self, timeout: Optional[float] = None) -> RunResult:
        """Wait until the run ends (bounded sources done, or ``stop()``); raise its error if it failed."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"flow {self.supervisor.plan.flow_name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result
