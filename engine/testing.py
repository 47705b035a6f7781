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
from typing import Optional

from driftstream.engine.connectors.local_kafka import local_kafka
from driftstream.engine.connectors.memory import MemorySink, MemorySource, PacedSource

__all__ = ["MemorySource", "PacedSource", "MemorySink", "local_kafka", "wait_for_actor"]


def wait_for_actor(name: str, not_id: Optional[object] = None, stop: Optional[threading.Event] = None):
    """The live Ray actor playing instance ``name`` (``<flow>/<stage>/<i>``, namespace
    ``driftstream``) once there is one: the actor of that name, or a standby (or warm actor,
    see :func:`~driftstream.engine.warm_up`) playing it. Skips the incarnation whose actor id is ``not_id``; None if ``stop``
    is set first. For fault tests."""
    import ray  # here, not at the top: tests of the simulator and in-memory flows need no Ray

    from driftstream.engine.runtime.ray_session import NAMESPACE

    from driftstream.engine.control.warm_actors import WARM_PREFIX

    standby_prefixes = (name.split("/")[0] + "/standby/", WARM_PREFIX)
    while stop is None or not stop.is_set():
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
            if handle._actor_id != not_id:
                return handle
        except ValueError:
            pass
        for standby in ray.util.list_named_actors(all_namespaces=True):
            if standby["namespace"] != NAMESPACE or not standby["name"].startswith(standby_prefixes):
                continue
            try:
                handle = ray.get_actor(standby["name"], namespace=NAMESPACE)
                if handle._actor_id != not_id and ray.get(handle.playing.remote(), timeout=5) == name:
                    return handle
            except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
        time.sleep(0.01)
    return None
