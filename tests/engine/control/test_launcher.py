"""What the launcher and the standby pool know of a run's actors, without Ray: which handle
plays which instance, which actors hold sinks, which standby is taken first."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.control.launcher import Launcher, acker_name_of
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.recovery import RecoveryRules
from driftstream.engine.testing import MemorySink, MemorySource


def launched() -> Launcher:
    """A launcher as a launch of a two-stage plan at parallelism 2 leaves it, handles faked."""
    flow = Flow("launched")
    flow.source(MemorySource(["a", "b"])).key_by(str).count().sink(MemorySink("out"))
    plan = flow.plan(2)
    launcher = Launcher(RecoveryRules(RunConfig(), snapshot_dir=None), StandbyPool(0))
    launcher.plan = plan
    launcher.actors = {i: f"actor {i.label}" for i in plan.instances}
    launcher.names = [acker_name_of(plan), *(plan.actor_name(i) for i in plan.instances)]
    launcher.handles = ["acker", *launcher.actors.values()]
    launcher.real_names = {launcher.names[1]: "launched/standby/0"}
    return launcher


def test_handles_and_names_follow_the_instances():
    run = launched()
    acker, first, *_ = run.names
    assert acker == "launched/acker"
    assert run.handles_of([first, acker, "another/acker"]) == ["acker", run.handles[1]]  # in launch order
    assert run.actor_names([acker, first]) == [acker, "launched/standby/0"]  # a standby keeps its name


def test_the_sinks_are_the_actors_of_the_stage_ending_in_the_sink():
    run = launched()
    assert run.sinks() == ["actor 1/0", "actor 1/1"]  # the count and its sink, after the shuffle


def test_standbys_are_taken_oldest_first_and_released_at_the_end():
    pool = StandbyPool(size=3)
    pool.entries = [("h0", "f/standby/0", None), ("h1", "f/standby/1", None)]
    assert pool.due(now=0.0)  # one is missing
    assert pool.take() == ("h0", "f/standby/0") and len(pool) == 1
    assert pool.release() == (["h1"], ["f/standby/1"]) and len(pool) == 0
