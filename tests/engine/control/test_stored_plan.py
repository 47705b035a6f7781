"""A detached flow's plan in Ray's GCS key-value store: stored under the flow's name, loaded
whole by each coordinator incarnation, dropped when the flow is removed."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.control.stored_plan import StoredPlan, forget_plan
from driftstream.engine.testing import MemorySink, MemorySource


def test_a_stored_plan_loads_as_it_was_and_is_gone_once_forgotten(ray_session):
    flow = Flow("stored-plan")
    flow.source(MemorySource(list(range(50_000))), name="numbers").map(lambda x: x + 1).sink(MemorySink("out"))
    plan = flow.plan(2)
    where = StoredPlan.put(plan)
    assert where == StoredPlan("stored-plan")  # a few bytes as an argument, however large the plan (here ~100 KB+)
    loaded = where.load()
    assert loaded.describe() == plan.describe() and loaded.steps[0].source.partitions() == plan.steps[0].source.partitions()
    forget_plan("stored-plan")
    with pytest.raises(RuntimeError, match="no longer in the cluster's key-value store"):
        where.load()
