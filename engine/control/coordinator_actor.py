"""The coordinator's actor: one run's supervisor (:class:`~.supervisor.RaySupervisor`) in a Ray
actor of its own, which the driver waits on and ``FlowHandle`` calls (status, stop, rescale).
A warm one (no flow yet) takes a flow and retires after it. How a driver runs one, and restarts
it when it dies: :mod:`.coordinator`.

>>> coordinator = CoordinatorActor.remote(plan, RunConfig())      # doctest: +SKIP
>>> result, error = ray.get(coordinator.run.remote(None))         # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Optional, Union

import ray

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowGone
from driftstream.engine.model.plan import Plan
from driftstream.engine.control.metrics_export import start_export
from driftstream.engine.control.stored_plan import StoredPlan
from driftstream.engine.control.supervisor import RaySupervisor
from driftstream.engine.control.warm_set import WarmActors
from driftstream.engine.runtime.ray_session import check_no_leftovers


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
        #: the niceness every thread of this process runs at now
        self.niceness = self.base_niceness
        if plan is not None:
            self._begin(plan, config, detached, warm)

    def take(self, plan: Plan, config: RunConfig, warm: Optional[WarmActors] = None) -> bool:
        """A warm coordinator's start of a flow, as the constructor's; False (nothing taken) when
        this process already runs at a lower priority than ``config`` asks (niceness only rises)."""
        if self.flow_name is not None:
            raise RuntimeError(f"this coordinator runs flow {self.flow_name!r} already")
        if self.niceness > self._niceness(config):
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
        if self._niceness(config) > self.niceness:  # an actor has its own worker process: only it is affected
            self.niceness = self._niceness(config)
            nice_this_thread(self.niceness)
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
        nice_this_thread(self.niceness)
        if self.flow_name is None or (flow is not None and flow != self.flow_name):
            raise FlowGone(f"flow {flow or '(any)'!r} has ended: its coordinator runs {self.flow_name or 'no flow'!r} now")

    def run(self, timeout: Optional[float] = None) -> tuple:
        """``(result, None)`` or ``(None, error)``: the error goes back as it is (a StepError
        with its fields), not wrapped in Ray's task error."""
        nice_this_thread(self.niceness)
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


def nice_this_thread(niceness: int) -> None:
    """Run the calling thread at ``niceness`` if it runs at less. Linux's niceness is a thread's:
    a warm coordinator takes its flow in one method's thread and supervises it in another, so
    each flow method sets its own; the threads the supervisor starts inherit it. Ray's own
    threads keep the worker's (its calls and answers are not the background work)."""
    if hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) < niceness:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
