"""The Ray session a run uses: connecting, the namespace, leftovers of a flow, killing actors.

Every actor of a run is a named actor in namespace ``driftstream``, named
``<flow>/<stage>/<index>`` (the acker ``<flow>/acker``, the coordinator
``<flow>/coordinator``).

>>> NAMESPACE
'driftstream'
"""

from __future__ import annotations

import os
import time
from typing import Optional

import ray

NAMESPACE = "driftstream"

#: Lean Ray settings for small machines (no task events, no metrics, no usage stats).
LEAN_RAY_ENV = {
    "RAY_task_events_report_interval_ms": "0",
    "RAY_enable_metrics_collection": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def ensure_ray(address: Optional[str] = None) -> bool:
    """Connect to Ray unless already connected; True if this call started the connection."""
    if ray.is_initialized():
        return False
    for k, v in LEAN_RAY_ENV.items():
        os.environ.setdefault(k, v)
    kwargs: dict = {"namespace": NAMESPACE, "log_to_driver": True, "configure_logging": False}
    if address is None:
        # "local": always a new local instance; plain ray.init() would attach to any
        # cluster this machine's last `ray start` left a trace of.
        address = "local"
        kwargs["include_dashboard"] = False
    ray.init(address=address, **kwargs)
    return True


def node_ip() -> str:
    """This node's IP address, where an actor's data-plane endpoint listens."""
    return ray.util.get_node_ip_address()


def check_no_leftovers(flow_name: str, grace_s: float = 10.0) -> None:
    """Fail if actors of a flow with this name run; waits ``grace_s`` for those of a dead driver to go."""
    prefix = f"{flow_name}/"
    deadline = time.time() + grace_s
    while any(a["name"].startswith(prefix) for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE):
        if time.time() < deadline:
            time.sleep(0.1)
            continue
        raise RuntimeError(
            f"actors of a flow named {flow_name!r} are already running in namespace {NAMESPACE!r}: "
            "wait for that run to end or give this flow another name"
        )


def kill_actors(handles: list, names: list, wait_s: float = 10.0) -> set:
    """Kill ``handles`` and wait up to ``wait_s`` until their ``names`` are free for new
    actors; returns the names still taken (Ray frees the name of an actor on a node that
    vanished only once its health check declares the node dead)."""
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:
            pass
    names = set(names)
    deadline = time.time() + wait_s
    while names:
        taken = names & {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
        if not taken or time.time() >= deadline:
            return taken
        time.sleep(0.02)
    return set()
