"""The coordinator: the run's supervisor as a Ray actor in the cluster (its actor:
:mod:`.coordinator_actor`), and how a driver runs one.

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

import time
from typing import Any, Callable, Optional

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.control.resume import check_sources
from driftstream.engine.control.stored_plan import StoredPlan, forget_plan
from driftstream.engine.control.coordinator_actor import COORDINATOR_SUFFIX, CoordinatorActor, coordinator_name  # noqa: F401  (this module's names too)
from driftstream.engine.control.flow_registry import claim, release
from driftstream.engine.control.warm_actors import hand_back, take_warm
from driftstream.engine.control.warm_set import WarmActors, retire
from driftstream.engine.runtime.ray_session import NAMESPACE, check_no_leftovers


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

    Only the coordinator's own death restarts it: an error of the run (a source that cannot
    be opened, an actor whose setup failed) is raised as it is, at once. What the driver
    can check is checked before any actor starts (:func:`~.resume.check_sources`).
    """
    check_sources(plan)
    restarts = 0
    # The first coordinator and its launch take warm actors instead of starting processes.
    taken = take_warm(len(plan.instances) + config.standby_count, ackers=1, coordinators=1)
    while True:
        coordinator, name, warm = _coordinator_for(plan, config, taken)
        if on_coordinator is not None:
            on_coordinator(coordinator)
        retired = None
        try:
            result, error = ray.get(coordinator.run.remote(timeout))
            if taken is not None:
                retired = ray.get(coordinator.retired.remote())
        except RayActorError as exc:
            if not coordinator_died(exc, coordinator) or not config.takes_snapshots or restarts >= max_restarts:
                raise
            restarts += 1
            config = config.resumed()  # the new coordinator recovers from the newest manifest
            check_no_leftovers(plan.flow_name)  # its actors died with it; wait until their names are free
            continue
        finally:
            if not warm:
                remove(coordinator, plan.flow_name)  # releases its claim too
            else:
                if retired is not None:  # back to the pool with the others (one that died is killed with them)
                    retired += retire([coordinator], [name])
                release(plan.flow_name, name)
            # Not tied to the coordinator by Ray: the ones it did not retire (all, if it died) are killed.
            hand_back(taken, retired)
            taken = None
        if error is not None:
            raise error  # the run's own, as it is: a new coordinator would only meet it again
        result.metrics.recoveries += restarts  # the new coordinator counts only its own
        return result


def _coordinator_for(plan: Plan, config: RunConfig, taken: Optional[WarmActors]) -> tuple:
    """``(handle, Ray name, warm)``: the coordinator that runs ``plan``, registered under its
    flow's name (:mod:`.flow_registry`); a warm one of ``taken`` if it takes the flow, else a
    new one, named after the flow, on the driver's node (it shares the driver's fate anyway,
    and a worker node lost to the cluster must cost a recovery of that node's actors, not a
    new coordinator)."""
    if taken is not None and taken.coordinators:
        handle, name = taken.coordinators[0]
        claim(plan.flow_name, name)
        try:
            if ray.get(handle.take.remote(plan, config, warm=taken.for_coordinator())):
                return handle, name, True
        except RayActorError:
            pass  # died in the pool: hand_back replaces it
        release(plan.flow_name, name)
    name = coordinator_name(plan)
    claim(plan.flow_name, name)
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    handle = CoordinatorActor.options(name=name, namespace=NAMESPACE, scheduling_strategy=here).remote(
        plan, config, warm=taken.for_coordinator() if taken is not None else None)
    return handle, name, False


def coordinator_died(exc: RayActorError, coordinator: Any) -> bool:
    """Whether ``exc``, raised by a call to ``coordinator``, says that this actor's process died
    (a restart resumes the run), rather than that its constructor raised (a restart fails alike)."""
    return not exc.actor_init_failed and exc.actor_id in (None, coordinator._actor_id.hex())


def start_detached(plan: Plan, config: RunConfig, launch_timeout: float = 120.0) -> Any:
    """Start ``plan`` under a detached coordinator and return its handle once the run's
    actors are up: the run outlives this driver, and ``driftstream status/stop`` (or
    :func:`~driftstream.engine.api.handle.attach`) reach it by the flow's name.

    It is placed on this driver's node if it can be (the head node, for ``driftstream start``
    there or a Ray job), elsewhere if that node is lost; Ray restarts it up to 3 times when
    the run takes snapshots (each restart resumes from the newest one).
    """
    from driftstream.engine.model.errors import FlowError

    check_sources(plan)
    try:
        check_no_leftovers(plan.flow_name, grace_s=0)
        claim(plan.flow_name, coordinator_name(plan), grace_s=0)
    except RuntimeError:
        raise FlowError(f"a flow named {plan.flow_name!r} is already on this cluster: `driftstream status {plan.flow_name}` "
                        f"shows it, `driftstream stop {plan.flow_name}` stops it (then start it with --resume to continue)") from None
    restarts = 3 if config.takes_snapshots else 0
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    coordinator = CoordinatorActor.options(
        name=coordinator_name(plan), namespace=NAMESPACE, lifetime="detached", max_restarts=restarts,
        max_task_retries=-1 if restarts else 0, scheduling_strategy=here,
    ).remote(StoredPlan.put(plan), config, detached=True)  # not the plan: a restart needs it after this driver is gone
    error = ray.get(coordinator.wait_launched.remote(launch_timeout))
    if error is not None:
        remove(coordinator, plan.flow_name)
        raise error
    return coordinator


def remove(coordinator: Any, flow_name: str) -> None:
    """End a coordinator actor started for the flow ``flow_name`` (detached ones stay until
    this), wait until its name is free, and drop its claim of the flow's name."""
    try:
        ray.kill(coordinator, no_restart=True)
    except Exception:
        pass
    _wait_gone(flow_name + COORDINATOR_SUFFIX)
    release(flow_name, flow_name + COORDINATOR_SUFFIX)
    forget_plan(flow_name)


def _wait_gone(name: str, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and any(a["name"] == name for a in ray.util.list_named_actors(all_namespaces=True)):
        time.sleep(0.02)
