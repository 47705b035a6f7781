"""The flow registry (engine/control/flow_registry.py): a flow's name -> its coordinator's actor
name in Ray's key-value store, held while that actor lives, taken over once it is gone."""

from __future__ import annotations

import time

import pytest
import ray
from ray.experimental import internal_kv

from driftstream.engine.control import flow_registry
from driftstream.engine.control.flow_registry import FlowNameTaken, claim, coordinator_of, flow_names, holder, release

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Holder:
    def ping(self) -> bool:
        return True


def started(name: str):
    actor = Holder.options(name=name, namespace="driftstream").remote()
    ray.get(actor.ping.remote())
    return actor


def test_a_live_holder_keeps_its_name_and_a_gone_one_gives_it_up(ray_session):
    first = started("registry-test/a")
    claim("registry-flow", "registry-test/a")
    try:
        assert holder("registry-flow") == "registry-test/a" and "registry-flow" in flow_names()
        assert coordinator_of("registry-flow")._actor_id == first._actor_id
        claim("registry-flow", "registry-test/a")  # again by its holder: still its own
        with pytest.raises(FlowNameTaken, match="already running"):
            claim("registry-flow", "registry-test/b", grace_s=0.3)
        release("registry-flow", "registry-test/b")  # not the holder's: nothing
        assert holder("registry-flow") == "registry-test/a"
        ray.kill(first, no_restart=True)
        claim("registry-flow", "registry-test/b", grace_s=10)  # the holder is gone: taken over
        assert holder("registry-flow") == "registry-test/b"
        assert not [k for k in internal_kv._internal_kv_list("", namespace=flow_registry.KV_NAMESPACE) if b"takeover" in k]
    finally:
        release("registry-flow", "registry-test/b")
        release("registry-flow", "registry-test/a")
    assert holder("registry-flow") is None and "registry-flow" not in flow_names()
    with pytest.raises(ValueError, match="no flow named"):
        coordinator_of("registry-flow")


def test_a_takeover_another_driver_is_doing_is_not_done_twice_and_its_stale_lock_expires(ray_session):
    """Two drivers that find the same dead holder: the one that finds the other's lock does not
    overwrite; a lock left by a driver that died mid-way stops counting after LOCK_STALE_S."""
    claim("registry-race", "registry-test/dead")  # an actor that never lived: a gone holder
    lock = f"takeover:registry-race\0registry-test/dead"
    internal_kv._internal_kv_put(lock, str(time.time()), namespace=flow_registry.KV_NAMESPACE)
    try:
        assert not flow_registry._take_over("registry-race", "registry-test/dead", "registry-test/late")
        assert holder("registry-race") == "registry-test/dead"
        internal_kv._internal_kv_put(lock, str(time.time() - flow_registry.LOCK_STALE_S - 1), namespace=flow_registry.KV_NAMESPACE)
        claim("registry-race", "registry-test/late", grace_s=5)  # the stale lock is dropped, then taken over
        assert holder("registry-race") == "registry-test/late"
        assert flow_names().count("registry-race") == 1 and not any(n.startswith("takeover:") for n in flow_names())
    finally:
        release("registry-race", "registry-test/late")
        internal_kv._internal_kv_del(lock, namespace=flow_registry.KV_NAMESPACE)
