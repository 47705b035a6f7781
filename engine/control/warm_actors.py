"""Warm actors: stage actors and ackers started ahead of a flow, with no flow yet, that the
next flow this driver starts takes instead of starting processes.

A flow's start on a running Ray session is mostly new processes: each costs ~0.45 s of CPU
(Python, Ray's worker, the engine's imports), five of them ~2.3 s of wall time on two cores,
while the engine's own steps take ~0.1 s. A warm actor is such a process already started; a
launch resets it into an instance (as it resets a standby), which takes milliseconds.

>>> import driftstream.engine as ds
>>> ds.warm_up(stage_actors=4)                 # doctest: +SKIP
>>> flow.run(parallelism=2)                    # doctest: +SKIP

The run takes them: it starts no process but its coordinator.

A flow takes every warm actor there is (those it does not need stay its standbys) and they end
with it; warm up again for the next one. Warm actors belong to this driver, not to the flow's
coordinator: :func:`~driftstream.engine.control.coordinator.run_coordinated` kills the ones it
handed out when the coordinator ends, so none outlives its flow (Ray ties the actors a
coordinator starts to it; these it must be told to end). A detached flow takes none.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import Optional

import ray

from driftstream.engine.runtime.actors import AckerActor, StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, ensure_ray, kill_actors

#: A warm actor's Ray name is this, the driver's pid and a count (no flow's name starts so).
WARM_PREFIX = "__warm__/"


@dataclass
class WarmActors:
    """Started actors with no flow: ``stages`` and ``ackers``, each ``(handle, Ray name)``."""

    stages: list = field(default_factory=list)
    ackers: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stages) + len(self.ackers)

    def handles(self) -> list:
        return [h for h, _ in self.stages + self.ackers]

    def names(self) -> list:
        return [n for _, n in self.stages + self.ackers]

    def take_acker(self) -> Optional[tuple]:
        """A warm acker ``(handle, name)`` out of the set, or None."""
        return self.ackers.pop(0) if self.ackers else None


_lock = threading.Lock()
_pool = WarmActors()
_count = itertools.count()


def warm_up(stage_actors: int = 4, ackers: int = 1, address: Optional[str] = None) -> None:
    """Start ``stage_actors`` stage actors and ``ackers`` ackers (adding to those already warm),
    for the next flow this driver starts. Connects to Ray first if needed (``address``: see
    :func:`~driftstream.engine.runtime.ray_session.ensure_ray`). Returns once they are up."""
    if stage_actors < 0 or ackers < 0:
        raise ValueError(f"warm_up takes counts >= 0, not stage_actors={stage_actors!r}, ackers={ackers!r}")
    ensure_ray(address)
    new = WarmActors()
    for _ in range(stage_actors):
        name = _next_name()
        new.stages.append((StageActor.options(name=name, namespace=NAMESPACE, scheduling_strategy="SPREAD").remote(None, None, None, None, None), name))
    for _ in range(ackers):
        name = _next_name()
        new.ackers.append((AckerActor.options(name=name, namespace=NAMESPACE, scheduling_strategy="SPREAD").remote(None, None), name))
    ray.get([h.ping.remote() for h in new.handles()])  # started: a flow taking them waits for no process
    with _lock:
        _pool.stages.extend(new.stages)
        _pool.ackers.extend(new.ackers)


def _next_name() -> str:
    return f"{WARM_PREFIX}{os.getpid()}/{next(_count)}"


def take_warm() -> WarmActors:
    """Every warm actor, out of the pool (empty when there is none), for one flow's launch."""
    global _pool
    with _lock:
        taken, _pool = _pool, WarmActors()
    return taken


def warm_count() -> int:
    """How many warm actors wait for a flow."""
    return len(_pool)


def end_warm(actors: Optional[WarmActors]) -> None:
    """Kill ``actors`` (a :class:`WarmActors` handed to a flow, or the pool's when None):
    their flow ended, or its coordinator died. Killing one already gone is harmless."""
    if actors is None:
        actors = take_warm()
    if len(actors):
        kill_actors(actors.handles(), actors.names(), wait_s=0)
