"""A detached coordinator's plan, kept in Ray's GCS key-value store rather than passed as an argument.

Ray keeps an actor's constructor arguments for its restarts, but one over 100 KiB
(``max_direct_call_object_size``) goes to the object store, owned by the driver that
created the actor: once that driver exits (``driftstream start`` returns at once), the
argument is gone and a restart of the coordinator fails, so the detached flow vanished
instead of resuming (Ray says so as it creates the actor: "core_worker.cc: ... has
constructor arguments in the object store and max_restarts > 0", ray-project/ray#53727).
A plan holds its sources, and a source may hold its data: ``live_clicks``' plan is 2.7 MB.
The plan is stored in the GCS's key-value store under the flow's name (it lives as long as
the cluster, whoever started the flow), and the coordinator gets a :class:`StoredPlan`,
a few bytes, which each incarnation loads. :func:`forget_plan` drops it when the flow is
removed; a new start of the same name overwrites it.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray.cloudpickle as cloudpickle
from ray.experimental import internal_kv

from driftstream.engine.model.plan import Plan

#: The GCS key-value namespace of the stored plans.
KV_NAMESPACE = "driftstream-plans"


@dataclass(frozen=True)
class StoredPlan:
    """Where a detached flow's plan is: its key in :data:`KV_NAMESPACE`."""

    key: str

    @classmethod
    def put(cls, plan: Plan) -> "StoredPlan":
        """Store ``plan`` under its flow's name (replacing an earlier one's) and return where."""
        key = plan.flow_name
        internal_kv._internal_kv_put(key, cloudpickle.dumps(plan), overwrite=True, namespace=KV_NAMESPACE)
        return cls(key)

    def load(self) -> Plan:
        """The plan stored by :meth:`put` (written by the engine's own driver, never by a user)."""
        data = internal_kv._internal_kv_get(self.key, namespace=KV_NAMESPACE)
        if data is None:
            raise RuntimeError(f"the plan of detached flow {self.key!r} is no longer in the cluster's key-value store "
                               f"(namespace {KV_NAMESPACE!r}): the flow was removed; start it again with --resume")
        return cloudpickle.loads(data)


def forget_plan(flow_name: str) -> None:
    """Drop a removed flow's stored plan (nothing if there is none)."""
    if internal_kv._internal_kv_initialized():
        internal_kv._internal_kv_del(flow_name, namespace=KV_NAMESPACE)
