"""``FlowHandle``: a running flow, for unbounded sources.

>>> handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps")   # doctest: +SKIP
>>> handle.status()["watermark"]                                                              # doctest: +SKIP
>>> handle.stop()          # final snapshot, then shut down; returns the RunResult            # doctest: +SKIP
>>> flow.start(parallelism=2, guarantee="exactly-once", snapshot_dir="/data/snaps", resume=True)  # doctest: +SKIP

A flow started with ``detached=True`` (or ``driftstream start``) runs on without its driver;
any driver connected to the cluster reaches it by name:

>>> handle = attach("orders", address="auto")                                                # doctest: +SKIP
>>> [f["name"] for f in list_flows()]                                                         # doctest: +SKIP
['orders']
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from driftstream.engine.control.coordinator import remove, run_coordinated, start_detached
from driftstream.engine.control.flow_registry import coordinator_of, flow_names
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError, FlowGone
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.runtime.ray_session import check_no_leftovers, ensure_ray

def start_on_ray(plan: Plan, address: Optional[str] = None, detached: bool = False, **options) -> "FlowHandle":
    """Start ``plan`` on Ray in the background; see :meth:`driftstream.engine.Flow.start`."""
    config = RunConfig.from_options(**options)
    if detached:
        import ray

        if address is None and not ray.is_initialized():
            raise FlowError("a detached flow needs a Ray cluster to outlive this driver: pass address='auto' (the cluster "
                            "`ray start --head` runs on this machine) or address='HOST:PORT'")
        ensure_ray(address)
        return FlowHandle(plan.flow_name, coordinator=start_detached(plan, config))
    started_ray = ensure_ray(address)
    check_no_leftovers(plan.flow_name)
    handle = FlowHandle(plan.flow_name)
    handle._run_here(plan, config, started_ray)
    handle._has_coordinator.wait()  # from here on, attach() finds it by name
    handle._raise_if_refused()
    return handle


def attach(name: str, address: Optional[str] = None) -> "FlowHandle":
    """The handle of the flow named ``name`` running on the cluster (connects to ``address``
    first if this process is not connected to Ray yet)."""
    import ray

    if address is not None or not ray.is_initialized():
        ensure_ray(address or "auto")
    try:
        coordinator = coordinator_of(name)
    except ValueError:
        running = ", ".join(f["name"] for f in list_flows()) or "none"
        raise FlowError(f"no flow named {name!r} runs on this cluster (running: {running})") from None
    handle = FlowHandle(name, coordinator=coordinator)
    try:
        handle._owner_elsewhere = not handle.describe()["detached"]
    except FlowGone:  # ended between the lookup and the call
        raise FlowError(f"no flow named {name!r} runs on this cluster (it has just ended)") from None
    return handle


def list_flows() -> list:
    """``describe()`` of every flow on the connected cluster: name, state (starting, running,
    stopping, finished, failed), detached, started_at, guarantee, parallelism, snapshot_dir..."""
    import ray

    flows = []
    for name in flow_names():
        try:
            flows.append(ray.get(coordinator_of(name).describe.remote(name), timeout=10))
        except FlowGone:
            pass  # ended between the listing and the call
        except Exception as exc:  # gone or restarting between the listing and the call
            flows.append({"name": name, "state": f"unreachable ({type(exc).__name__})"})
    return sorted(flows, key=lambda f: f["name"])


class FlowHandle:
    """A flow running under its coordinator actor.

    Started here (``flow.start()``), a driver thread runs it and restarts a coordinator that
    dies; detached (``attach()``), the coordinator runs it by itself and Ray restarts it.
    """

    def __init__(self, name: str, coordinator: Any = None) -> None:
        self.name = name
        self._coordinator = coordinator
        self._has_coordinator = threading.Event()
        if coordinator is not None:
            self._has_coordinator.set()
        self._thread: Optional[threading.Thread] = None
        self._result: Optional[RunResult] = None
        self._error: Optional[BaseException] = None
        # Attached to a flow a driver runs (flow.start() elsewhere): that driver removes its
        # coordinator when the run ends, and restarts one that dies.
        self._owner_elsewhere = False

    @property
    def detached(self) -> bool:
        return self._thread is None

    def _run_here(self, plan: Plan, config: RunConfig, started_ray: bool) -> None:
        self._thread = threading.Thread(target=self._run, args=(plan, config, started_ray), name=f"driftstream-{plan.flow_name}", daemon=True)
        self._thread.start()

    def _run(self, plan: Plan, config: RunConfig, started_ray: bool) -> None:
        try:
            self._result = run_coordinated(plan, config, on_coordinator=self._set_coordinator)
        except BaseException as exc:  # handed to wait()
            self._error = exc
        finally:
            self._has_coordinator.set()
            if started_ray:
                import ray

                ray.shutdown()

    def _raise_if_refused(self, timeout: float = 120.0) -> None:
        """Once the run's actors are up, return; raise the error that ended the run before,
        e.g. a snapshot that does not fit the flow, or a sink that cannot take its parallelism."""
        import ray

        if self._coordinator is None:  # refused before any coordinator started (a source checked on the driver)
            self._thread.join()
            raise self._error
        try:
            error = ray.get(self._coordinator.wait_launched.remote(timeout, self.name), timeout=timeout + 10)
        except (ray.exceptions.RayActorError, FlowGone):
            error = True  # removed or retired already: the run has ended, its error is the thread's
        if error is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error

    def _set_coordinator(self, coordinator) -> None:
        self._coordinator = coordinator
        self._has_coordinator.set()

    def _running_here(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> dict:
        """Watermark and its lag behind the clock, source lag, elements emitted and released,
        elements per step, release latency over the last 10 s, dead letters, records skipped
        (at-most-once), the last snapshot (T, duration, age) and every recovery (detected at,
        seconds to restored and to first new output), and the coordinator's niceness."""
        import ray

        self._has_coordinator.wait()
        if self.detached:
            return dict({"running": True}, **ray.get(self._coordinator.status.remote(self.name), timeout=60))
        if self._thread.is_alive():
            try:
                return dict(ray.get(self._coordinator.status.remote(self.name), timeout=30), running=True)
            except Exception:
                if self._thread.is_alive():
                    raise
        return {"running": False, "error": None if self._error is None else str(self._error)}

    def describe(self) -> dict:
        """Name, state, guarantee, parallelism, snapshot dir, when it started (``driftstream list``)."""
        import ray

        self._has_coordinator.wait()
        return ray.get(self._coordinator.describe.remote(self.name), timeout=30)

    def rescale(self, parallelism: int, timeout: Optional[float] = 300.0) -> dict:
        """Change the running flow's parallelism: its sources stop reading, what they read
        settles and is released, a snapshot is taken, and every stage restarts at
        ``parallelism`` from it, key groups and partitions reassigned. Output is the same as
        without the rescale, under the run's guarantee. Returns when the flow runs again:
        ``{"from", "to", "snapshot", "drain_s", "restart_s", "first_output_s"}``.

        >>> handle.rescale(4)["first_output_s"]         # doctest: +SKIP
        0.41
        """
        import ray

        self._has_coordinator.wait()
        report = ray.get(self._coordinator.rescale.remote(parallelism, self.name), timeout=timeout)
        if isinstance(report, BaseException):
            raise report
        return report

    def stop(self, timeout: Optional[float] = None) -> RunResult:
        """Take a final snapshot, shut every actor down, and return what the run released.
        A detached flow's coordinator is removed then, which frees its name for a resume."""
        import ray

        self._has_coordinator.wait()
        if self.detached or self._thread.is_alive():
            try:
                ray.get(self._coordinator.stop.remote(self.name), timeout=30)
            except Exception:
                if self._running_here():
                    raise
        try:
            return self.wait(timeout)
        finally:
            if self.detached and not self._owner_elsewhere:
                remove(self._coordinator, self.name)

    def wait(self, timeout: Optional[float] = None) -> RunResult:
        """Wait until the run ends (bounded sources done, or ``stop()``); raise its error if it failed."""
        if self.detached:
            self._wait_detached(timeout)
        else:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"flow {self.name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    def _wait_detached(self, timeout: Optional[float]) -> None:
        import ray

        deadline = None if timeout is None else time.time() + timeout
        while True:
            left = 10.0 if deadline is None else max(0.0, min(10.0, deadline - time.time()))
            try:
                done, self._result, self._error = ray.get(self._coordinator.outcome.remote(left, self.name))
            except (ray.exceptions.RayActorError, FlowGone):
                if not self._owner_elsewhere:
                    raise
                return  # its driver has taken the result and removed (or retired) the coordinator
            if done:
                return
            if deadline is not None and time.time() >= deadline:
                raise TimeoutError(f"flow {self.name!r} still running after {timeout}s")
