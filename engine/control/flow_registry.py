"""Which coordinator runs a flow: the flow's name -> its coordinator's Ray actor name, in the
cluster's key-value store (Ray's GCS), read by every driver and the CLI.

A flow used to be found by its coordinator's Ray name, ``<flow>/coordinator``, and Ray's names
kept two flows of one name apart. Ray cannot name an actor that already runs, so a coordinator
started ahead of any flow (warm, ~0.45 s of a flow's start) needs this registry instead:

>>> claim("orders", "__warm__/4242/7")      # doctest: +SKIP
>>> coordinator_of("orders")                # its handle, as ray.get_actor gives   # doctest: +SKIP
>>> release("orders", "__warm__/4242/7")    # doctest: +SKIP

A claim is held until its holder releases it or its actor is gone: a dead driver's non-detached
coordinators die with it, so its flows' names are free again without anyone releasing them.
Taking over a dead holder's claim is a compare-and-set built from put-if-absent: a lock key per
stale value, then the value read again under it (two drivers cannot both take one over).
Each call costs one or two GCS round trips (~1 ms); a conflict adds an actor lookup.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import ray
from ray.experimental import internal_kv

from driftstream.engine.runtime.ray_session import NAMESPACE

#: The GCS key-value namespace of the registry.
KV_NAMESPACE = "driftstream-flows"
#: A takeover's lock key is this, the flow's name and the stale holder's name.
_LOCK = "takeover:"
#: A takeover lock older than this was left by a driver that died mid-way; it no longer counts.
LOCK_STALE_S = 30.0


class FlowNameTaken(RuntimeError):
    """A live coordinator runs a flow of this name."""


def claim(flow_name: str, coordinator: str, grace_s: float = 10.0) -> None:
    """Register ``coordinator`` (an actor name in Ray's namespace ``driftstream``) as running
    ``flow_name``. A claim whose holder is gone is taken over; one still held after ``grace_s``
    (a dead driver's coordinator takes a moment to go) raises :class:`FlowNameTaken`."""
    deadline = time.time() + grace_s
    while True:
        if not internal_kv._internal_kv_put(flow_name, coordinator, overwrite=False, namespace=KV_NAMESPACE):
            return  # it was free
        held = holder(flow_name)
        if held == coordinator:
            return  # ours already (a restarted coordinator of the same name)
        if held is not None and not _alive(held):
            if _take_over(flow_name, held, coordinator):
                return
            continue
        if time.time() >= deadline:
            raise FlowNameTaken(f"a flow named {flow_name!r} is already running on this cluster (its coordinator "
                                f"{held!r}): wait for that run to end or give this flow another name")
        time.sleep(0.1)


def _take_over(flow_name: str, stale: str, coordinator: str) -> bool:
    """Replace the claim ``stale`` (a gone holder's) by ``coordinator``'s; False if another
    driver changed it first."""
    lock = f"{_LOCK}{flow_name}\0{stale}"
    if internal_kv._internal_kv_put(lock, str(time.time()), overwrite=False, namespace=KV_NAMESPACE):
        taken_at = internal_kv._internal_kv_get(lock, namespace=KV_NAMESPACE)
        if taken_at is not None and time.time() - float(taken_at) > LOCK_STALE_S:
            internal_kv._internal_kv_del(lock, namespace=KV_NAMESPACE)
        return False
    try:
        if holder(flow_name) != stale:
            return False
        internal_kv._internal_kv_put(flow_name, coordinator, overwrite=True, namespace=KV_NAMESPACE)
        return True
    finally:
        internal_kv._internal_kv_del(lock, namespace=KV_NAMESPACE)


def release(flow_name: str, coordinator: str) -> None:
    """Drop ``coordinator``'s claim of ``flow_name`` (nothing if another holds it, or none)."""
    if internal_kv._internal_kv_initialized() and holder(flow_name) == coordinator:
        internal_kv._internal_kv_del(flow_name, namespace=KV_NAMESPACE)


def holder(flow_name: str) -> Optional[str]:
    """The actor name of the coordinator that claimed ``flow_name``, or None."""
    value = internal_kv._internal_kv_get(flow_name, namespace=KV_NAMESPACE)
    return None if value is None else value.decode()


def coordinator_of(flow_name: str) -> Any:
    """The handle of the coordinator running ``flow_name``; ValueError if none does."""
    held = holder(flow_name)
    if held is None:
        raise ValueError(f"no flow named {flow_name!r} is registered")
    return ray.get_actor(held, namespace=NAMESPACE)


def flow_names() -> list:
    """The names of every registered flow (some may have a holder that just died)."""
    return sorted(k.decode() for k in internal_kv._internal_kv_list("", namespace=KV_NAMESPACE)
                  if not k.startswith(_LOCK.encode()))


def _alive(actor_name: str) -> bool:
    try:
        ray.get_actor(actor_name, namespace=NAMESPACE)
        return True
    except ValueError:
        return False
