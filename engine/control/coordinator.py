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
import warnings
from typing import Any, Callable, Optional, Union

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowGone
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.control.metrics_export import start_export
from driftstream.engine.control.resume import check_sources
from driftstream.engine.control.stored_plan import StoredPlan, forget_plan
from driftstream.engine.control.supervisor import RaySupervisor
from driftstream.engine.control.flow_registry import claim, release
from driftstream.engine.control.warm_actors import WarmActors, hand_back, retire, take_warm
from driftstream.engine.runtime.ray_session import NAMESPACE, check_no_leftovers


@ray.remote(num_cpus=0, max_concurrency=8)
class CoordinatorActor:
    """One run's supervisor; ``run()`` blocks in one actor thread while ``status``/``stop`` answer in others.

    ``config.coordinator_niceness`` lowers this process's CPU priority (see
    :data:`~driftstream.engine.model.config.COORDINATOR_NICENESS`).

    ``detached``: the actor runs the flow by itself (a thread started here) and keeps its
    outcome until :func:`remove` takes it; no driver waits on ``run()``. Ray restarts it
    if its process dies (:func:`start_detached`), and the new incarnation resumes from the
    newest snapshot, as a new coordinator does under :func:`run_coordinated`.

    Started with no plan, it is warm (see :mod:`.warm_actors`): :meth:`take` gives it a flow,
    :meth:`retire` makes it flowless again once the run is over. Calls that name a ``flow``
    raise :class:`FlowGone` when it no longer runs that one (a handle kept past its flow's end).
    """

    def __init__(self, plan: Union[Plan, StoredPlan, None] = None, config: Optional[RunConfig] = None, detached: bool = False,
                 warm: Optional[WarmActors] = None) -> None:
        self.flow_name: Optional[str] = None
        #: the niceness Ray started this worker at; a flow's ``coordinator_niceness`` adds to it
        self.base_niceness = os.nice(0) if hasattr(os, "nice") else 0
        if plan is not None:
            self._begin(plan, config, detached, warm)

    def take(self, plan: Plan, config: RunConfig, warm: Optional[WarmActors] = None) -> bool:
        """A warm coordinator's start of a flow, as the constructor's; False (nothing taken) when
        this process already runs at a lower priority than ``config`` asks (niceness only rises)."""
        if self.flow_name is not None:
            raise RuntimeError(f"this coordinator runs flow {self.flow_name!r} already")
        if hasattr(os, "nice") and os.nice(0) > self._niceness(config):
            return False
        self._begin(plan, config, False, warm)
        return True

    def retire(self) -> None:
        """After its run: forget the flow, for the next :meth:`take` (see
        :func:`~.warm_actors.retire`, which kills one that raises)."""
        if self.flow_name is not None and not self.done.is_set():
            raise RuntimeError(f"flow {self.flow_name!r} still runs here")
        self.flow_name = None

    def ping(self) -> bool:
        return True

    def _begin(self, plan: Union[Plan, StoredPlan], config: RunConfig, detached: bool, warm: Optional[WarmActors]) -> None:
        if isinstance(plan, StoredPlan):  # a detached flow's (start_detached): each incarnation loads it
            plan = plan.load()
        if hasattr(os, "nice"):  # an actor has its own worker process: only it is affected
            os.nice(max(0, self._niceness(config) - os.nice(0)))
        self.detached = detached
        self.started_at = time.time()
        self.restarts = 0
        if detached and _reconstructed():
            # The previous incarnation's actors died with it (Ray ties them to their creator).
            self.restarts = 1
            config = config.resumed()
            check_no_leftovers(plan.flow_name, exclude={coordinator_name(plan)})
        self.config = config
        self.plan = plan
        self.launched = threading.Event()
        self.done = threading.Event()
        self.outcome_: tuple = (None, None)
        self.exporter = None
        self.retired_: list = []
        self.flow_name = plan.flow_name
        try:
            self.supervisor: Optional[RaySupervisor] = RaySupervisor(plan, config, warm)
        except Exception as exc:  # run() hands it back as itself; raised here, the driver would see only its text
            self.supervisor, self.outcome_ = None, (None, exc)
            self.retired_ = warm.names() if warm is not None else []  # untouched: the driver's as they were
            self.launched.set()
            self.done.set()
            return
        self.exporter = start_export(plan.flow_name, config, self.supervisor.live_status, self.launched)
        if detached:
            threading.Thread(target=self.run, name="driftstream-detached", daemon=True).start()

    def _niceness(self, config: RunConfig) -> int:
        return min(19, self.base_niceness + config.coordinator_niceness)

    def _playing(self, flow: Optional[str]) -> None:
        """Raise :class:`FlowGone` if a call for ``flow`` (None: any) reached this coordinator
        after it left that flow."""
        if self.flow_name is None or (flow is not None and flow != self.flow_name):
            raise FlowGone(f"flow {flow or '(any)'!r} has ended: its coordinator runs {self.flow_name or 'no flow'!r} now")

    def run(self, timeout: Optional[float] = None) -> tuple:
        """``(result, None)`` or ``(None, error)``: the error goes back as it is (a StepError
        with its fields), not wrapped in Ray's task error."""
        if self.supervisor is None:
            return self.outcome_  # the supervisor could not be set up
        try:
            outcome = self.supervisor.run(timeout, on_launched=self.launched.set), None
        except Exception as exc:
            outcome = None, exc
        finally:
            self.launched.set()
            if self.exporter is not None:
                self.exporter.stop()
            self.retired_ = self.supervisor.shutdown()
        if outcome[0] is not None:
            outcome[0].metrics.recoveries += self.restarts
        self.outcome_ = outcome
        self.done.set()
        return outcome

    def retired(self) -> list:
        """After :meth:`run`: the names of the driver's warm actors this run retired (see
        :func:`~driftstream.engine.control.warm_actors.hand_back`)."""
        return self.retired_

    def wait_launched(self, timeout: float, flow: Optional[str] = None) -> Optional[BaseException]:
        """Block until the run's actors are up (or it failed first); its error, if any."""
        self._playing(flow)
        self.launched.wait(timeout)
        return self.outcome_[1] if self.done.wait(0.2) else None

    def outcome(self, timeout: float, flow: Optional[str] = None) -> tuple:
        """``(done, result, error)``, waiting up to ``timeout`` s for the end of a detached run."""
        self._playing(flow)
        done = self.done.wait(timeout)
        return (done, *self.outcome_)

    def describe(self, flow: Optional[str] = None) -> dict:
        """What ``driftstream list`` shows; answers at once, also while the run starts."""
        self._playing(flow)
        c, s = self.config, self.supervisor
        state = ("failed" if self.outcome_[1] is not None else "finished") if self.done.is_set() else (
            "stopping" if s.stop_requested.is_set() else "running" if self.launched.is_set() else "starting")
        return {"name": self.flow_name, "state": state, "detached": self.detached, "started_at": self.started_at,
                "guarantee": c.guarantee.value, "snapshot_interval": c.snapshot_interval, "snapshot_dir": s and s.snapshot_dir,
                "parallelism": (s.plan if s else self.plan).parallelism, "restarts": self.restarts,
                "error": None if self.outcome_[1] is None else str(self.outcome_[1])}

    def status(self, flow: Optional[str] = None) -> dict:
        self._playing(flow)
        self.launched.wait()
        if self.done.is_set():
            error = self.outcome_[1]
            return {"running": False, "state": self.describe()["state"], "error": None if error is None else str(error)}
        return dict(self.supervisor.live_status(), coordinator_niceness=os.nice(0) if hasattr(os, "nice") else None)

    def stop(self, flow: Optional[str] = None) -> None:
        self._playing(flow)
        if self.supervisor is not None:
            self.supervisor.stop_requested.set()

    def rescale(self, parallelism: int, flow: Optional[str] = None) -> Any:
        """Move the running flow to ``parallelism`` (:meth:`RaySupervisor.request_rescale`);
        returns its report once it runs again and its first output came (at most 5 s later),
        or the error that refused it."""
        self._playing(flow)
        self.launched.wait()
        if self.supervisor is None:
            return self.outcome_[1]
        try:
            request = self.supervisor.request_rescale(parallelism)
        except Exception as exc:
            return exc
        request.done.wait()
        if request.error is not None:
            return request.error
        report = request.report
        return report.wait_first_output(5.0).report()


def _reconstructed() -> bool:
    """Whether this actor is a restart. Ray's property reads its own deprecated ``actor_id``
    and warns into every driver's log; the warning says nothing to a user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ray.get_runtime_context().was_current_actor_reconstructed


#: A new coordinator's actor name is its flow's name and this (a warm one keeps its own: flows
#: are found through :mod:`.flow_registry`).
COORDINATOR_SUFFIX = "/coordinator"


def coordinator_name(plan: Plan) -> str:
    return plan.flow_name + COORDINATOR_SUFFIX


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
    taken = take_warm(len(plan.instances) + config.standbys, ackers=1, coordinators=1)
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
                remove(coordinator, plan.flow_name)
            elif retired is not None:  # back to the pool with the others (one that died is killed with them)
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
