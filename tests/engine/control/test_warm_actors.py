"""Warm actors (engine/control/warm_actors.py): started before a flow, they play its instances
and its acker instead of new processes, come back retired when it ends, and none outlives a
coordinator that died. The session's pool (tests/conftest.py) is what these tests take."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import ray

from driftstream.engine import Flow, attach, list_flows, warm_up
from driftstream.engine.control.flow_registry import coordinator_of, holder
from driftstream.engine.model.errors import FlowGone
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.control.warm_actors import WARM_PREFIX, end_warm, fresh_pool, take_warm, warm_count, warm_pool
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource, cold_start, wait_for_actor

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


def live_warm_names() -> set:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(WARM_PREFIX)}


def pids(names) -> dict:
    handles = {n: ray.get_actor(n, namespace="driftstream") for n in names}
    return {n: ray.get(h.__ray_call__.remote(lambda self: os.getpid())) for n, h in handles.items()}


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.05)


def test_flows_play_on_warm_actors_that_come_back_retired_for_the_next(ray_session):
    """A flow takes as many warm actors as it has instances, and an acker; no process is named
    after an instance. When it ends they come back, the same processes, with nothing of it left
    (no working directory), and the next flow runs on them and gives its own output."""
    pool = warm_pool()
    flow = counting("warmed", PacedSource(list(range(N)), rate=3_000, partitions=2), MemorySink("out"))
    plan = flow.plan(2)
    assert len(pool.stages) >= len(plan.instances)
    before = pids(pool.names())
    handle = flow.start(parallelism=2)
    try:
        assert warm_count() == len(pool) - len(plan.instances) - 2  # as many as it needs, an acker, a coordinator
        taken = [n for _, n in pool.stages[: len(plan.instances)]]
        assert {ray.get(ray.get_actor(n, namespace="driftstream").playing.remote()) for n in taken} == {
            plan.actor_name(i) for i in plan.instances}
        own = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("warmed/")]
        assert own == []  # no process was started for an instance, the acker or the coordinator
        assert holder("warmed") == pool.coordinators[0][1]  # found by the flow's name through the registry
        assert attach("warmed").describe()["name"] == "warmed" and "warmed" in [f["name"] for f in list_flows()]
    finally:
        result = handle.wait(timeout=120)
    assert sorted(result.output("out")) == expected_counts(N)
    assert holder("warmed") is None and "warmed" not in [f["name"] for f in list_flows()]
    with pytest.raises(FlowGone):  # a handle kept past its flow's end does not reach the next flow
        ray.get(pool.coordinators[0][0].status.remote("warmed"))
    back = warm_pool()
    assert sorted(back.names()) == sorted(pool.names()) and pids(back.names()) == before  # the same processes
    assert all(ray.get(ray.get_actor(n, namespace="driftstream").playing.remote()) is None for _, n in back.stages)
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("driftstream-warmed-")]  # retired: workdirs gone
    again = counting("warmed-again", MemorySource(list(range(500)), partitions=2), MemorySink("out"))
    assert sorted(again.run(parallelism=2).output("out")) == expected_counts(500)
    assert pids(warm_pool().names()) == before


def test_a_failed_flow_and_a_killed_warm_actor_leave_the_pool_its_size(ray_session, tmp_path):
    """A flow that fails still retires its warm actors; one killed in a recovery is replaced by a
    new warm actor once its flow ends."""
    size = warm_count()

    def fails(x):
        if x == 50:
            raise ValueError("fifty")
        return x

    broken = Flow("warm-fails")
    broken.source(MemorySource(list(range(100)), partitions=2)).map(fails).sink(MemorySink("out"))
    names = set(warm_pool().names())
    with pytest.raises(Exception, match="fifty"):
        broken.run(parallelism=2)
    assert warm_count() == size and set(warm_pool().names()) == names  # all retired, none replaced

    out = tmp_path / "out"
    flow = counting("warm-kill", PacedSource(list(range(N)), rate=1_500, partitions=2), FileSink(str(out), name="out"))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    wait_until(lambda: handle.status().get("snapshots", 0) >= 1, "a snapshot within 60 s")
    victim = wait_for_actor("warm-kill/key_by/1", timeout=30)
    victim_name = next(n for n in names if ray.get_actor(n, namespace="driftstream")._actor_id == victim._actor_id)
    ray.kill(victim, no_restart=True)
    result = handle.wait(timeout=120)
    assert result.metrics.recoveries == 1
    assert sorted(tuple(v) for _, v in read_file_sink(str(out), "out")) == expected_counts(N)
    pool = warm_pool()
    assert warm_count() == size and victim_name not in pool.names()  # replaced by a new one
    assert all(ray.get(h.ping.remote(), timeout=60) for h in pool.handles())


def test_warm_actors_end_with_a_coordinator_that_died_and_the_output_stays_exactly_once(ray_session, tmp_path):
    """The warm actors belong to the driver, not to the coordinator: when it dies they must not
    run on beside the new coordinator's actors (they would write the output twice). The pool gets
    new ones in their place."""
    out = tmp_path / "out"
    flow = counting("warm-death", PacedSource(list(range(N)), rate=1_500, partitions=2), FileSink(str(out), name="out"))
    size = warm_count()
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    taken = set(live_warm_names()) - set(warm_pool().names())
    assert len(taken) == len(flow.plan(2).instances) + 2  # and the acker and the coordinator
    wait_until(lambda: handle.status().get("snapshots", 0) >= 1 and len(read_file_sink(str(out), "out")) > N // 4,
               "a snapshot and output within 60 s")
    ray.kill(coordinator_of("warm-death"), no_restart=True)
    wait_until(lambda: not taken & live_warm_names(), f"warm actors of the dead coordinator still run: {taken & live_warm_names()}")
    result = handle.wait(timeout=120)
    assert result.metrics.recoveries == 1
    assert sorted(tuple(v) for _, v in read_file_sink(str(out), "out")) == expected_counts(N)
    assert warm_count() == size and not taken & set(warm_pool().names())


def test_cold_start_sets_the_pool_aside_and_end_warm_empties_it(ray_session):
    pool = warm_pool()
    with cold_start():
        assert warm_count() == 0
        flow = counting("cold", PacedSource(list(range(600)), rate=300), MemorySink("out"))
        handle = flow.start(parallelism=1)
        own = lambda: {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("cold/")}  # noqa: E731
        wait_until(lambda: {"cold/acker", "cold/source/0"} <= own(), f"new processes named after what they play: {own()}")
        assert sorted(handle.wait(timeout=120).output("out")) == expected_counts(600)
    assert warm_pool().names() == pool.names()
    with pytest.raises(ValueError, match="counts >= 0"):
        warm_up(stage_actors=-1)
    try:
        end_warm()
        assert warm_count() == 0
        wait_until(lambda: not live_warm_names(), "end_warm() ends every warm actor")
    finally:
        warm_up(stage_actors=len(pool.stages), ackers=len(pool.ackers), coordinators=len(pool.coordinators))  # the session's pool


def test_a_pool_from_a_ray_session_the_driver_left_is_forgotten(ray_session):
    """After ``ray.shutdown()`` and a new ``ray.init()`` the pool's actors are gone with the old
    session: a flow must not be handed them (its launch would wait on dead actors)."""
    from driftstream.engine.control import warm_actors

    with fresh_pool():
        warm_up(stage_actors=1, ackers=0, coordinators=0)
        warm_actors._job[0] = "a job of a session this driver left"
        assert not len(take_warm(1)) and warm_count() == 0  # (here, Ray ends the dropped actor: no handle is left)
        warm_up(stage_actors=1, ackers=0, coordinators=0)
        assert len(take_warm(1)) == 1  # a pool of this session is taken again


def test_a_warm_coordinator_at_a_lower_priority_than_a_flow_asks_is_replaced_by_a_new_one(ray_session):
    """A process's niceness only rises: a warm coordinator that ran a flow at the default
    ``coordinator_niceness`` cannot run one that asks for 0. That flow gets a new coordinator
    (named after it), at the niceness it asked for, and the pool a new warm one."""
    counting("nice-first", MemorySource(list(range(200)), partitions=2), MemorySink("out")).run(parallelism=2)  # sets its niceness
    coordinators = [n for _, n in warm_pool().coordinators]
    flow = counting("nice-zero", PacedSource(list(range(600)), rate=600, partitions=2), MemorySink("out"))
    handle = flow.start(parallelism=2, coordinator_niceness=0)
    try:
        assert holder("nice-zero") == "nice-zero/coordinator"
        worker_niceness = ray.get(ray.get_actor(pool_stage_name(), namespace="driftstream").__ray_call__.remote(lambda self: os.nice(0)))
        assert handle.status()["coordinator_niceness"] == worker_niceness
    finally:
        result = handle.wait(timeout=120)
    assert sorted(result.output("out")) == expected_counts(600)
    wait_until(lambda: len(warm_pool().coordinators) == len(coordinators), "the pool gets a warm coordinator again")
    assert not set(coordinators) & {n for _, n in warm_pool().coordinators}  # the refused one was ended


def pool_stage_name() -> str:
    return warm_pool().stages[0][1]
