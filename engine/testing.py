"""What tests, examples and the demo use: in-memory sources and sinks, the local broker,
and a helper for fault tests.

>>> from driftstream.engine import Flow
>>> flow = Flow("upper")
>>> out = MemorySink("out")
>>> flow.source(MemorySource(["a", "b"])).map(str.upper).sink(out)
>>> flow.run(runtime="simulator", seed=1).output("out")
['A', 'B']
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from driftstream.engine.connectors.local_kafka import local_kafka
from driftstream.engine.connectors.memory import MemorySink, MemorySource, PacedSource

__all__ = ["MemorySource", "PacedSource", "MemorySink", "local_kafka", "actor_of", "wait_for_actor", "kill_at", "cold_start"]


def actor_of(name: str, not_id: Optional[object] = None):
    """The live Ray actor playing instance ``name`` (``<flow>/<stage>/<i>``, namespace
    ``driftstream``) now, or None: the actor of that name, or a standby (or warm actor, see
    :func:`~driftstream.engine.warm_up`) playing it. Skips the incarnation whose actor id is
    ``not_id``. ``<flow>/coordinator`` is the flow's coordinator, a warm one too (found through
    the flow registry). For fault tests: ``ray.kill(actor_of("wc/count/0"))``."""
    import ray  # here, not at the top: tests of the simulator and in-memory flows need no Ray

    from driftstream.engine.control.coordinator import COORDINATOR_SUFFIX
    from driftstream.engine.control.flow_registry import coordinator_of
    from driftstream.engine.control.warm_actors import WARM_PREFIX
    from driftstream.engine.runtime.ray_session import NAMESPACE

    if name.endswith(COORDINATOR_SUFFIX):
        try:
            handle = coordinator_of(name[: -len(COORDINATOR_SUFFIX)])
            return handle if handle._actor_id != not_id else None
        except ValueError:
            return None

    try:
        handle = ray.get_actor(name, namespace=NAMESPACE)
        if handle._actor_id != not_id:
            return handle
    except ValueError:
        pass
    standby_prefixes = (name.split("/")[0] + "/standby/", WARM_PREFIX)
    for standby in ray.util.list_named_actors(all_namespaces=True):
        if standby["namespace"] != NAMESPACE or not standby["name"].startswith(standby_prefixes):
            continue
        try:
            handle = ray.get_actor(standby["name"], namespace=NAMESPACE)
            if handle._actor_id != not_id and ray.get(handle.playing.remote(), timeout=5) == name:
                return handle
        except (ValueError, AttributeError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # gone, a warm coordinator (it plays no instance), or busy
    return None


def kill_at(progress: Callable[[], int], kills: list) -> threading.Thread:
    """A thread that kills, for each ``(name, at)`` of ``kills`` in turn, the actor playing
    instance ``name`` once ``progress()`` (e.g. lines of output) reaches ``at``; ``name`` may be
    a tuple of names, killed together (as a node's loss would: each found first). A replica is
    named as ``control/replica_launch.replica_name`` says. What it could not kill (no live actor
    plays it: the run ended first) is in the thread's ``errors``."""
    import ray

    def run() -> None:
        for names, at in kills:
            while progress() < at:
                time.sleep(0.02)
            victims = [(name, actor_of(name)) for name in ((names,) if isinstance(names, str) else names)]
            for name, victim in victims:
                if victim is None:
                    thread.errors.append(f"{name} at progress {progress()}: no live actor plays it")
                    return
            for _, victim in victims:
                ray.kill(victim, no_restart=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = []  # type: ignore[attr-defined]
    thread.start()
    return thread


def fault_at(progress: Callable[[], int], name: str, at: int, kind: str, seed: int = 0) -> threading.Thread:
    """A thread that injects fault ``kind`` (a name of ``runtime/state_faults.FAULTS``)
    into the keyed state of the actor playing instance ``name`` once ``progress()`` reaches
    ``at``, trying again every 20 ms until it finds something to strike; what it struck is in
    the thread's ``faults``, what it could not do in its ``errors``."""
    import ray

    def run() -> None:
        while progress() < at:
            time.sleep(0.02)
        for _ in range(500):
            actor = actor_of(name)
            if actor is None:
                thread.errors.append(f"{name} at progress {progress()}: no live actor plays it")
                return
            try:
                done = ray.get(actor.inject_fault.remote(kind, seed))
            except ray.exceptions.RayActorError as exc:  # it struck, was caught and the actor exited before it answered
                thread.faults.append(f"{kind}: the actor exited before it answered ({type(exc).__name__})")
                return
            if done is not None:
                thread.faults.append(done)
                return
            time.sleep(0.02)
        thread.errors.append(f"{name}: nothing to strike")

    thread = threading.Thread(target=run, daemon=True)
    thread.errors, thread.faults = [], []  # type: ignore[attr-defined]
    thread.start()
    return thread


def wait_for_actor(name: str, not_id: Optional[object] = None, stop: Optional[threading.Event] = None,
                   timeout: Optional[float] = None):
    """:func:`actor_of` once there is one; None if ``stop`` is set first; TimeoutError after
    ``timeout`` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while stop is None or not stop.is_set():
        handle = actor_of(name, not_id)
        if handle is not None:
            return handle
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no live actor plays {name} after {timeout:g} s")
        time.sleep(0.01)
    return None


def cold_start():
    """A context in which flows start processes for their instances and acker, as with no
    :func:`~driftstream.engine.warm_up`: the driver's warm actors wait outside, untouched
    (:func:`~driftstream.engine.control.warm_actors.fresh_pool`). For tests of the cold path."""
    from driftstream.engine.control.warm_actors import fresh_pool

    return fresh_pool(None)
