"""Standbys: started stage actors with no instance, waiting to take a lost instance's place.

A recovery resets a standby with the lost instance's key instead of creating a process:
starting one costs ~1 s of CPU on a small machine, most of a kill -> first new output.
A standby keeps its own Ray name (``<flow>/standby/<n>``; Ray cannot rename an actor).

>>> pool = StandbyPool(size=1)
>>> len(pool), pool.due(now=0.0)         # none started yet: one is due
(0, True)
>>> pool.delay(2.0, now=10.0); pool.due(now=11.0), pool.due(now=12.0)
(False, True)
"""

from __future__ import annotations

import time
from typing import Optional

import ray

from driftstream.engine.model.plan import Plan
from driftstream.engine.runtime.actors import StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE, kill_actors


class StandbyPool:
    """Up to ``size`` standbys, each ``(handle, actor name, ref of its node())``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: list = []
        self._started = 0
        self._replenish_at = 0.0

    def __len__(self) -> int:
        return len(self.entries)

    def due(self, now: Optional[float] = None) -> bool:
        """Whether standbys are missing and may be started now (see :meth:`delay`)."""
        return len(self.entries) < self.size and (time.time() if now is None else now) >= self._replenish_at

    def delay(self, seconds: float, now: Optional[float] = None) -> None:
        """Start no standby for ``seconds``: after a recovery, a process start (about a second
        of CPU) must not slow the replay that catches up."""
        self._replenish_at = (time.time() if now is None else now) + seconds

    def replenish(self, plan: Plan) -> None:
        """Start standbys for ``plan``'s flow up to ``size``."""
        while len(self.entries) < self.size:
            name = f"{plan.flow_name}/standby/{self._started}"
            self._started += 1
            handle = StageActor.options(name=name, namespace=NAMESPACE, scheduling_strategy="SPREAD").remote(plan, None, None, None, None)
            self.entries.append((handle, name, handle.node.remote()))

    def adopt(self, actors: list) -> None:
        """Add started stage actors with no instance, ``(handle, Ray name)`` (warm actors, see
        :mod:`.warm_actors`): launches take them before any new process."""
        self.entries.extend((handle, name, handle.node.remote()) for handle, name in actors)

    def take(self) -> tuple:
        """The oldest standby, ``(handle, actor name)``, out of the pool."""
        handle, name, _ = self.entries.pop(0)
        return handle, name

    def drop_on(self, nodes: set) -> None:
        """Kill the standbys known to run on ``nodes`` (lost ones) or known dead; keep the rest
        (one whose node is not known yet is still starting)."""
        kept = []
        for handle, name, node in self.entries:
            try:
                lost = bool(ray.wait([node], timeout=0)[0]) and ray.get(node) in nodes
            except ray.exceptions.RayActorError:
                lost = True
            if lost:
                kill_actors([handle], [])
            else:
                kept.append((handle, name, node))
        self.entries = kept

    def release(self) -> tuple:
        """Empty the pool: ``(handles, names)`` of its standbys, for the caller to kill."""
        handles, names = [e[0] for e in self.entries], [e[1] for e in self.entries]
        self.entries = []
        return handles, names
