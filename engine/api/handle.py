"""``FlowHandle``: a running flow, for unbounded sources.

>>> handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps")   # doctest: +SKIP
>>> handle.status()["watermark"]                                                              # doctest: +SKIP
>>> handle.stop()          # final snapshot, then shut down; returns the RunResult            # doctest: +SKIP
>>> flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps", resume=True)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Optional

from driftstream.engine.control.coordinator import run_coordinated
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.runtime.ray_session import check_no_leftovers, ensure_ray


def start_on_ray(plan: Plan, address: Optional[str] = None, **options) -> "FlowHandle":
    """Start ``plan`` on Ray in the background; see :meth:`driftstream.engine.Flow.start`."""
    config = RunConfig.from_options(**options)
    started_ray = ensure_ray(address)
    check_no_leftovers(plan.flow_name)
    return FlowHandle(plan, config, started_ray)


class FlowHandle:
    """A flow running under its coordinator actor; a driver thread waits for the result."""

    def __init__(self, plan: Plan, config: RunConfig, started_ray: bool) -> None:
        self.plan = plan
        self._started_ray = started_ray
        self._result: Optional[RunResult] = None
        self._error: Optional[BaseException] = None
        self._coordinator = None
        self._has_coordinator = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(config,), name=f"driftstream-{plan.flow_name}", daemon=True)
        self._thread.start()

    def _run(self, config: RunConfig) -> None:
        try:
            self._result = run_coordinated(self.plan, config, on_coordinator=self._set_coordinator)
        except BaseException as exc:  # handed to wait()
            self._error = exc
        finally:
            self._has_coordinator.set()
            if self._started_ray:
                import ray

                ray.shutdown()

    def _set_coordinator(self, coordinator) -> None:
        self._coordinator = coordinator
        self._has_coordinator.set()

    def status(self) -> dict:
        """Watermark, source lag, elements emitted and released, dead letters, records skipped
        (at-most-once), the last snapshot (T, duration) and every recovery (detected at,
        seconds to restored and to first new output), and the coordinator's niceness."""
        import ray

        self._has_coordinator.wait()
        if self._thread.is_alive():
            try:
                return dict(ray.get(self._coordinator.status.remote(), timeout=30), running=True)
            except Exception:
                if self._thread.is_alive():
                    raise
        return {"running": False, "error": None if self._error is None else str(self._error)}

    def stop(self, timeout: Optional[float] = None) -> RunResult:
        """Take a final snapshot, shut every actor down, and return what the run released."""
        import ray

        self._has_coordinator.wait()
        if self._thread.is_alive():
            try:
                ray.get(self._coordinator.stop.remote(), timeout=30)
            except Exception:
                if self._thread.is_alive():
                    raise
        return self.wait(timeout)

    def wait(self, timeout: Optional[float] = None) -> RunResult:
        """Wait until the run ends (bounded sources done, or ``stop()``); raise its error if it failed."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"flow {self.plan.flow_name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result
