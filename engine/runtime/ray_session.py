"""The Ray session a run uses: connecting, the namespace, leftovers of a flow, killing actors.

Every actor of a run is a named actor in namespace ``driftstream``, named
``<flow>/<stage>/<index>`` (the acker ``<flow>/acker``, the coordinator
``<flow>/coordinator``).

>>> NAMESPACE
'driftstream'
"""

from __future__ import annotations

import logging
import os
import socket
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
    """Connect to Ray unless already connected; True if this call started the connection.

    ``address`` None: a new local instance. Otherwise a cluster (``HOST:PORT``, or
    ``"auto"``: the one this machine's ``ray start`` runs), see :func:`connect_cluster`."""
    if ray.is_initialized():
        return False
    for k, v in LEAN_RAY_ENV.items():
        os.environ.setdefault(k, v)
    if address is None:
        # Ray 2.60 turns token authentication on for a new local instance when the mode is
        # unset, and warns on every run that it did: keep the authentication, drop the line.
        logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_not_the_token_notice)
        # "local": always a new local instance; plain ray.init() would attach to any
        # cluster this machine's last `ray start` left a trace of.
        ray.init(address="local", namespace=NAMESPACE, log_to_driver=True, configure_logging=False, include_dashboard=False)
    else:
        connect_cluster(address)
    return True


def _not_the_token_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


#: Where Ray looks for a cluster's authentication token (its own order).
AUTH_TOKEN_SOURCES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")


def auth_token_available() -> bool:
    """Whether this process can present a Ray authentication token (see :data:`AUTH_TOKEN_SOURCES`)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or os.path.isfile(path)


def connect_cluster(address: str) -> None:
    """Connect this driver to the Ray cluster at ``address``, presenting its token if it has one.

    Ray 2.60's ``ray start`` turns token authentication on, while a driver that connects by
    address does not send a token unless ``RAY_AUTH_MODE=token`` is set. With the mode unset
    and a token at hand, token mode is turned on here (a cluster without authentication
    accepts such a driver too). A cluster that refuses the driver gives a
    :class:`~driftstream.engine.model.errors.FlowError` that says what to export.
    """
    from driftstream.engine.model.errors import FlowError

    if "RAY_AUTH_MODE" not in os.environ and auth_token_available():
        _enable_token_mode()
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and not _accepts(host, int(port)):
        # Ray itself retries an address that refuses connections for a minute or more.
        raise FlowError(f"no Ray cluster answers at {address}: start one with `ray start --head`, or pass the address "
                        "that `ray start --head` printed (--address HOST:PORT)")
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True, configure_logging=False)
    except Exception as exc:
        text = f"{exc!r} {exc.__cause__!r}"
        if "InvalidAuthToken" in text or "AuthenticationError" in text or "Unauthenticated" in text:
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            raise FlowError(
                f"the Ray cluster at {address} refused this driver's authentication (RAY_AUTH_MODE is {mode}; "
                f"token found: {'yes' if auth_token_available() else 'no'}). The cluster uses token authentication "
                "(Ray 2.60's `ray start` turns it on): export RAY_AUTH_MODE=token and give the cluster's token, as "
                "RAY_AUTH_TOKEN=<token> or in ~/.ray/auth_token (on the head node, `ray get-auth-token` prints it)"
            ) from None
        if isinstance(exc, ConnectionError):
            raise FlowError(
                f"no Ray cluster answers at {address}: start one with `ray start --head`, or pass --address HOST:PORT "
                f"(the head's GCS address that `ray start --head` printed) ({exc})"
            ) from None
        raise


def _accepts(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def _enable_token_mode() -> None:
    """``RAY_AUTH_MODE=token`` for this process and its children. Ray reads the mode into its
    config when ``ray`` is imported, so the config is refreshed as Ray's own ``ray start``
    does; where that private hook is missing the environment variable alone is set."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def node_ip() -> str:
    """This node's IP address, where an actor's data-plane endpoint listens."""
    return ray.util.get_node_ip_address()


def check_no_leftovers(flow_name: str, grace_s: float = 10.0, exclude: frozenset = frozenset()) -> None:
    """Fail if actors of a flow with this name run (but those named in ``exclude``); waits
    ``grace_s`` for those of a dead driver to go."""
    prefix = f"{flow_name}/"
    deadline = time.time() + grace_s
    while any(a["name"].startswith(prefix) and a["name"] not in exclude
              for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE):
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
