"""Launching a run on Ray from the driver: its options checked (:class:`RunConfig`), then a
coordinator actor that runs it to the end.

>>> run_on_ray(flow.plan(parallelism=2), guarantee="exactly-once")   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Optional

import ray

from driftstream.engine.control.coordinator import run_coordinated
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult
from driftstream.engine.runtime.ray_session import check_no_leftovers, ensure_ray


def run_on_ray(plan: Plan, address: Optional[str] = None, timeout: Optional[float] = None, **options) -> RunResult:
    """Run ``plan`` on Ray to the end under a coordinator actor; see :meth:`driftstream.engine.Flow.run`.

    Options: ``seed``, ``batch_size``, ``max_inflight``, ``chaos``, ``sample_every``,
    ``guarantee``, ``snapshot_interval``, ``snapshot_dir``, ``resume``, ``heartbeat_timeout``
    (seconds an actor may not answer a ping before it is taken for dead),
    ``coordinator_niceness`` and, for tests, ``faults``: the fields of
    :class:`~driftstream.engine.model.config.RunConfig`, checked here before Ray starts.
    """
    config = RunConfig.from_options(**options)
    started_ray = ensure_ray(address)
    try:
        check_no_leftovers(plan.flow_name)
        return run_coordinated(plan, config, timeout)
    finally:
        if started_ray:
            ray.shutdown()
