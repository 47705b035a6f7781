"""Warm actors: stage actors and ackers started ahead of a flow, with no flow yet, that the
flows this driver starts take instead of starting processes.

A flow's start on a running Ray session is mostly new processes: each costs ~0.45 s of CPU
(Python, Ray's worker, the engine's imports), five of them ~2.3 s of wall time on two cores,
while the engine's own steps take ~0.1 s. A warm actor is such a process already started; a
launch resets it into an instance (as it resets a standby), which takes milliseconds. A warm
coordinator takes a flow (``CoordinatorActor.take``) and is found by the flow's name through
:mod:`.flow_registry`, since Ray cannot name an actor that already runs.

>>> import driftstream.engine as ds
>>> ds.warm_up(stage_actors=4)                 # doctest: +SKIP
>>> flow.run(parallelism=2)                    # doctest: +SKIP
>>> other_flow.run(parallelism=2)              # doctest: +SKIP

Each run takes as many as it needs (its instances, its standbys, an acker, a coordinator)
and starts no process. When a flow ends, its coordinator retires them (each closes its
instance's sinks, backends and connections, and removes its working directory) and they come
back for the next flow. One that died with its flow, or did not retire, is killed and
replaced in the background, so the pool keeps the size ``warm_up`` gave it;
``end_warm()`` ends them all.

Warm actors belong to this driver, not to a flow's coordinator:
:func:`~driftstream.engine.control.coordinator.run_coordinated` kills those it handed out when
the coordinator dies, so none runs on beside a new coordinator's actors (Ray ties the actors a
coordinator starts to it; these it must be told to end). A detached flow takes none.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from typing import Iterator, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driftstream.engine.model.plan import Plan
from driftstream.engine.control.coordinator_actor import CoordinatorActor
from driftstream.engine.control.warm_set import WARM_PREFIX, WarmActors, retire  # noqa: F401  (their names here too)
from driftstream.engine.runtime.actors import AckerActor, StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, ensure_ray, kill_actors

_lock = threading.Lock()
_pool = WarmActors()
#: how many stage actors, ackers and coordinators the pool keeps (the sums of ``warm_up``'s counts since ``end_warm()``)
_target = [0, 0, 0]
_count = itertools.count()
#: the driver's Ray job the pool's actors were started in: after a new ``ray.init()`` they are gone
_job: list = [None]


def warm_up(stage_actors: int = 4, ackers: int = 1, address: Optional[str] = None, coordinators: int = 1) -> None:
    """Start ``stage_actors`` stage actors, ``ackers`` ackers and ``coordinators`` coordinators
    (adding to those already warm), for the flows this driver starts. Connects to Ray first if
    needed (``address``: see :func:`~driftstream.engine.runtime.ray_session.ensure_ray`).
    Returns once they are up."""
    counts = (stage_actors, ackers, coordinators)
    if min(counts) < 0:
        raise ValueError(f"warm_up takes counts >= 0, not stage_actors={stage_actors!r}, ackers={ackers!r}, coordinators={coordinators!r}")
    ensure_ray(address)
    new = _start(*counts)
    ray.get([h.ping.remote() for h in new.handles()])  # started: a flow taking them waits for no process
    with _lock:
        _forget_if_gone()
        _job[0] = ray.get_runtime_context().get_job_id()
        _target[:] = [a + b for a, b in zip(_target, counts)]
        _pool.add(new)


def _start(stage_actors: int, ackers: int, coordinators: int = 0) -> WarmActors:
    """Create warm actors (their processes start in the background). Coordinators on this
    driver's node, as :func:`~.coordinator.run_coordinated` places a new one."""
    def started(cls, args: tuple, strategy: object = "SPREAD") -> tuple:
        name = _next_name()
        return cls.options(name=name, namespace=NAMESPACE, scheduling_strategy=strategy).remote(*args), name

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False) if coordinators else None
    return WarmActors([started(StageActor, (None,) * 5) for _ in range(stage_actors)],
                      [started(AckerActor, (None, None)) for _ in range(ackers)],
                      [started(CoordinatorActor, (), here) for _ in range(coordinators)])


def _next_name() -> str:
    return f"{WARM_PREFIX}{os.getpid()}/{next(_count)}"


def take_warm(stage_actors: Optional[int] = None, ackers: Optional[int] = None, coordinators: Optional[int] = None) -> WarmActors:
    """Up to ``stage_actors`` warm stage actors, ``ackers`` ackers and ``coordinators``
    coordinators (None: all) out of the pool (an empty set when there is none), for one flow."""
    with _lock:
        _forget_if_gone()
        taken = WarmActors(_pool.stages[:stage_actors], _pool.ackers[:ackers], _pool.coordinators[:coordinators])
        del _pool.stages[:stage_actors], _pool.ackers[:ackers], _pool.coordinators[:coordinators]
    return taken


def _forget_if_gone() -> None:
    """Empty the pool if its actors belong to a Ray session this driver left (they ended with
    it: a launch must not wait on them). Under the lock."""
    if _job[0] is not None and (not ray.is_initialized() or ray.get_runtime_context().get_job_id() != _job[0]):
        _pool.stages.clear()
        _pool.ackers.clear()
        _pool.coordinators.clear()
        _target[:] = [0, 0, 0]
        _job[0] = None


def warm_count() -> int:
    """How many warm actors wait for a flow."""
    return len(_pool)


def warm_pool() -> WarmActors:
    """The warm actors waiting for a flow now (a copy: taking nothing)."""
    with _lock:
        return WarmActors(list(_pool.stages), list(_pool.ackers), list(_pool.coordinators))


def hand_back(taken: Optional[WarmActors], retired: Optional[list]) -> None:
    """A flow that took ``taken`` ended: those named in ``retired`` (that its coordinator
    retired; None when it died) go back to the pool, the rest of ``taken`` are killed. Missing
    ones are started again in the background, up to the pool's size."""
    if taken is None or not len(taken):
        return
    back, lost = taken.split(set(retired or ()))
    if len(lost):
        kill_actors(lost.handles(), lost.names(), wait_s=0)
    with _lock:
        _pool.add(back)
        missing = [max(0, want - len(have)) for want, have in zip(_target, (_pool.stages, _pool.ackers, _pool.coordinators))]
    if any(missing):
        refill = _start(*missing)
        with _lock:
            _pool.add(refill)


@contextlib.contextmanager
def fresh_pool(plan: Optional[Plan] = None) -> Iterator[None]:
    """Inside, the pool holds new warm actors for ``plan``'s instances and acker (none when
    None: flows start processes); the driver's warm actors wait outside, untouched, and are
    the pool again after (those made inside end). For a benchmark whose runs must not depend
    on the runs before them, and tests of the cold path."""
    global _pool
    with _lock:
        aside, target, job = _pool, list(_target), _job[0]
        _pool, _target[:] = WarmActors(), [0, 0, 0]
    try:
        if plan is not None:
            warm_up(stage_actors=len(plan.instances))
        yield
    finally:
        end_warm()
        with _lock:
            _pool.add(aside)
            _target[:], _job[0] = target, job


def end_warm(actors: Optional[WarmActors] = None) -> None:
    """Kill ``actors`` (a :class:`WarmActors` handed to a flow), or, when None, every warm actor
    in the pool (which then keeps none: ``warm_up`` starts it again). Killing one already gone is
    harmless."""
    if actors is None:
        with _lock:
            _target[:] = [0, 0, 0]
        actors = take_warm()
    if len(actors):
        kill_actors(actors.handles(), actors.names(), wait_s=0)
