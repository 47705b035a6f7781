"""The coordinator: the run's supervisor as a Ray actor in the cluster.

It schedules snapshots through the acker (which collects every ``prepared`` part), commits
manifests, watches every actor (death, missed heartbeats) and runs recovery
(:class:`~driftstream.engine.control.supervisor.RaySupervisor`, in an actor thread).
The driver only starts it and waits; ``FlowHandle.status()`` and ``stop()`` are
calls to it.

The stage actors and the acker are created by the coordinator, so Ray ties their
fate to it: if the coordinator dies, they die with it, and the driver starts a
new coordinator that resumes from the newest manifest (:func:`run_coordinated`),
as a new driver does after the old one was killed. Under exactly-once the output
is the same as a failure-free run's.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.control.metrics_export import start_export
from driftstream.engine.control.supervisor import RaySupervisor
from driftstream.engine.runtime.ray_session import NAMESPACE, check_no_leftovers


@ray.remote(num_cpus=0, max_concurrency=8)
class CoordinatorActor:
    """One run's supervisor; ``run()`` blocks in one actor thread while ``status``/``stop`` answer in others.

    ``config.coordinator_niceness`` lowers this process's CPU priority (see
    :data:`~driftstream.engine.model.config.COORDINATOR_NICENESS`).
    """

    def __init__(self, plan: Plan, config: RunConfig) -> None:
        niceness = config.coordinator_niceness
        if niceness and hasattr(os, "nice"):  # an actor has its own worker process: only it is affected
            os.nice(niceness)
        self.supervisor = RaySupervisor(plan, config)
        self.launched = threading.Event()
        self.exporter = start_export(plan.flow_name, config, self.supervisor.live_status, self.launched)

    def run(self, timeout: Optional[float] = None) -> tuple:
        """``(result, None)`` or ``(None, error)``: the error goes back as it is (a StepError
        with its fields), not wrapped in Ray's task error."""
        try:
            return self.supervisor.run(timeout, on_launched=self.launched.set), None
        except Exception as exc:
            return None, exc
        finally:
            self.launched.set()
            if self.exporter is not None:
                self.exporter.stop()
            self.supervisor.shutdown()

    def status(self) -> dict:
        self.launched.wait()
        return dict(self.supervisor.live_status(), coordinator_niceness=os.nice(0) if hasattr(os, "nice") else None)

    def stop(self) -> None:
        self.supervisor.stop_requested.set()


def coordinator_name(plan: Plan) -> str:
    return f"{plan.flow_name}/coordinator"


def run_coordinated(
    plan: Plan,
    config: RunConfig,
    timeout: Optional[float] = None,
    on_coordinator: Optional[Callable[[Any], None]] = None,
    max_restarts: int = 3,
) -> RunResult:
    """Run ``plan`` under a coordinator actor and return its result.

    If the coordinator dies and the run takes snapshots, a new coordinator resumes
    from the newest manifest (at most ``max_restarts`` times; each counts in
    ``metrics.recoveries``, the figures of ``metrics`` otherwise are the last
    coordinator's). ``on_coordinator`` is
    called with each coordinator's handle (``FlowHandle`` uses it for status and stop).
    """
    restarts = 0
    while True:
        # On the driver's node: it shares the driver's fate anyway, and a worker node lost
        # to the cluster must cost a recovery of that node's actors, not a new coordinator.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        coordinator = CoordinatorActor.options(name=coordinator_name(plan), namespace=NAMESPACE, scheduling_strategy=here).remote(
            plan, config
        )
        if on_coordinator is not None:
            on_coordinator(coordinator)
        try:
            result, error = ray.get(coordinator.run.remote(timeout))
            if error is not None:
                raise error
            result.metrics.recoveries += restarts  # the new coordinator counts only its own
            return result
        except RayActorError:
            if not config.takes_snapshots or restarts >= max_restarts:
                raise
            restarts += 1
            config = config.resumed()  # the new coordinator recovers from the newest manifest
            check_no_leftovers(plan.flow_name)  # its actors died with it; wait until their names are free
        finally:
            try:
                ray.kill(coordinator, no_restart=True)
            except Exception:
                pass
            _wait_gone(coordinator_name(plan))


def _wait_gone(name: str, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and any(a["name"] == name for a in ray.util.list_named_actors(all_namespaces=True)):
        time.sleep(0.02)
