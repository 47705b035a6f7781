"""Warm actors (engine/control/warm_actors.py): started before a flow, they play its instances
and its acker instead of new processes, and none outlives the flow or its coordinator."""

from __future__ import annotations

import time

import pytest
import ray

from driftstream.engine import Flow, warm_up
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.warm_actors import WARM_PREFIX, end_warm, warm_count
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource

pytestmark = pytest.mark.ray

N = 3_000


def counting(name: str, source, sink) -> Flow:
    flow = Flow(name)
    flow.source(source).key_by(lambda x: x % 5).stateful_map(lambda s, x: ((s or 0) + 1, (x, (s or 0) + 1))).sink(sink)
    return flow


def expected_counts(n: int) -> list:
    seen: dict = {}
    out = []
    for x in range(n):
        seen[x % 5] = seen.get(x % 5, 0) + 1
        out.append((x, seen[x % 5]))
    return sorted(out)


def warm_names() -> set:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(WARM_PREFIX)}


def test_a_flow_plays_its_instances_and_acker_on_warm_actors(ray_session):
    flow = counting("warmed", PacedSource(list(range(N)), rate=3_000, partitions=2), MemorySink("out"))
    plan = flow.plan(2)
    warm_up(stage_actors=len(plan.instances))
    assert warm_count() == len(plan.instances) + 1
    warm = warm_names()
    handle = flow.start(parallelism=2)
    try:
        assert warm_count() == 0  # the flow took them all
        playing = {ray.get(ray.get_actor(n, namespace="driftstream").playing.remote())
                   for n in warm if n != max(warm, key=lambda s: int(s.rsplit("/", 1)[1]))}  # the last one started is the acker
        assert playing == {plan.actor_name(i) for i in plan.instances}
        # no process was started for an instance or the acker: none has its own name
        own = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("warmed/")]
        assert own == ["warmed/coordinator"]
    finally:
        result = handle.wait(timeout=120)
    assert sorted(result.output("out")) == expected_counts(N)
    assert not warm_names()  # ended with their flow


def test_warm_actors_end_with_a_coordinator_that_died_and_the_output_stays_exactly_once(ray_session, tmp_path):
    """The warm actors belong to the driver, not to the coordinator: when it dies they must not
    run on beside the new coordinator's actors (they would write the output twice)."""
    out = tmp_path / "out"
    flow = counting("warm-death", PacedSource(list(range(N)), rate=1_500, partitions=2), FileSink(str(out), name="out"))
    warm_up(stage_actors=len(flow.plan(2).instances))
    warm = warm_names()
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    deadline = time.time() + 120
    while not (handle.status().get("snapshots", 0) >= 1 and len(read_file_sink(str(out), "out")) > N // 4):
        assert time.time() < deadline, f"no snapshot and output within 120 s: {handle.status()}"
        time.sleep(0.05)
    ray.kill(ray.get_actor("warm-death/coordinator", namespace="driftstream"), no_restart=True)
    deadline = time.time() + 60
    while warm & warm_names():
        assert time.time() < deadline, f"warm actors of the dead coordinator still run: {warm & warm_names()}"
        time.sleep(0.05)
    result = handle.wait(timeout=120)
    assert result.metrics.recoveries == 1
    assert sorted(tuple(v) for _, v in read_file_sink(str(out), "out")) == expected_counts(N)


def test_end_warm_kills_the_pool_and_warm_up_refuses_negative_counts(ray_session):
    warm_up(stage_actors=1, ackers=0)
    assert warm_count() == 1 and warm_names()
    end_warm(None)
    assert warm_count() == 0
    deadline = time.time() + 30
    while warm_names():
        assert time.time() < deadline
        time.sleep(0.05)
    with pytest.raises(ValueError, match="counts >= 0"):
        warm_up(stage_actors=-1)
    flow = counting("cold", MemorySource(list(range(100))), MemorySink("out"))
    assert sorted(flow.run(parallelism=1).output("out")) == expected_counts(100)  # no warm actor: new processes
