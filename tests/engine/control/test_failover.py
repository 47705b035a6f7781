"""Failover's bookkeeping without Ray: a recovery's steps, how long the other actors'
answers are awaited, who is lost, who is hung, and the names new actors take. Ray's
``wait``/``get`` are replaced by fakes over plain objects: these are the decisions only."""

from __future__ import annotations

import time

import pytest
import ray

from driftstream.engine.control import failover
from driftstream.engine.control.failover import Failover, Heartbeat, recovery_steps, settle_answers
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.recovery import RecoveryRules


class Answers:
    """Fake refs answered at given offsets from now (None: never); ``ray.wait`` over them
    blocks as Ray's does: until ``num_returns`` are ready or ``timeout`` passes."""

    def __init__(self, offsets: list) -> None:
        start = time.time()
        self.at = {i: None if o is None else start + o for i, o in enumerate(offsets)}
        self.refs = list(self.at)

    def wait(self, refs: list, num_returns: int = 1, timeout: float = None) -> tuple:
        end = time.time() + (timeout or 0)
        while True:
            ready = [r for r in refs if self.at[r] is not None and self.at[r] <= time.time()]
            if len(ready) >= num_returns or time.time() >= end:
                return ready, [r for r in refs if r not in ready]
            time.sleep(0.001)


@pytest.fixture
def fake_ray(monkeypatch):
    """Install a fake ``ray.wait`` for the given answers; ``ray.get`` returns a ref's value
    (or raises it): the refs of these tests are their own results."""

    def install(wait):
        monkeypatch.setattr(ray, "wait", wait)
        monkeypatch.setattr(ray, "get", lambda ref, timeout=None: _raise(ref) if isinstance(ref, Exception) else ref)

    return install


def _raise(exc: Exception):
    raise exc


def test_a_recoverys_steps_add_up_to_its_time_to_restored():
    marks = [10.30, 10.50, 10.55, 10.56]
    steps = recovery_steps(detected=10.0, entered=10.02, probed=10.04, killed=10.25, marks=marks)
    assert list(steps) == ["confirm", "probe", "kill", "read_manifest", "reset", "connect", "start"]
    assert sum(steps.values()) == pytest.approx(marks[-1] - 10.0)
    assert steps["read_manifest"] == pytest.approx(0.05) and steps["reset"] == pytest.approx(0.2)


def test_answers_are_awaited_while_they_keep_coming(fake_ray):
    answers = Answers([0.0, 0.01, 0.02, 0.03, None])
    fake_ray(answers.wait)
    assert settle_answers(answers.refs, 1, deadline=time.time() + 1.0, quiet=0.02) == 4  # then 20 ms of quiet


def test_a_quiet_gap_ends_the_wait_early(fake_ray):
    answers = Answers([0.0, 0.005, 0.2, None])
    fake_ray(answers.wait)
    began = time.time()
    assert settle_answers(answers.refs, 1, deadline=began + 1.0, quiet=0.02) == 2
    assert time.time() - began < 0.1


def test_the_deadline_bounds_the_wait(fake_ray):
    answers = Answers([0.0, *(0.01 * i for i in range(1, 40))])
    fake_ray(answers.wait)
    began = time.time()
    assert settle_answers(answers.refs, 1, deadline=began + 0.05, quiet=0.02) < len(answers.refs)
    assert time.time() - began < 0.1
    assert settle_answers(answers.refs, 0, deadline=began + 1.0) == 0  # none answered: nothing to settle


def run_of(names: list) -> Launcher:
    launcher = Launcher(RecoveryRules(RunConfig(), snapshot_dir=None), StandbyPool(0))
    launcher.names, launcher.handles = names, [f"handle of {n}" for n in names]
    return launcher


def test_the_lost_are_the_failed_calls_and_the_peers_survivors_saw_die(fake_ray):
    names = ["f/acker", "f/0/0", "f/0/1", "f/1/0"]
    fo = Failover(run_of(names), StandbyPool(0))
    # f/0/0 died (its call failed); f/1/0 saw it and a stranger go; f/0/1 and the acker have not answered.
    alive = [None, ray.exceptions.RayActorError(), None, ["f/0/0", "other-flow/0/0"]]
    fake_ray(lambda refs, num_returns=1, timeout=None: ([r for r in refs if r is not None], []))
    assert fo.lost(alive) == {"f/0/0"}
    alive[2] = ["f/acker"]
    assert fo.lost(alive) == {"f/0/0", "f/acker"}


def test_a_name_ray_still_holds_is_taken_with_a_number_once(monkeypatch):
    fo = Failover(run_of(["f/acker", "f/0/0", "f/0/1"]), StandbyPool(0))
    fo.launcher.real_names = {"f/0/1": "f/standby/0"}
    asked = []
    monkeypatch.setattr(failover, "kill_actors", lambda handles, names, wait_s: asked.append(names) or {"f/0/0", "f/standby/0"})
    fo.kill(["h"], ["f/0/0", "f/0/1"])
    assert asked == [["f/0/0", "f/standby/0"]]  # the names of the actors playing them
    assert fo.renamed == {"f/0/0": "f/0/0#1", "f/0/1": "f/0/1#1"}
    assert fo.take_renames() == {"f/0/0": "f/0/0#1", "f/0/1": "f/0/1#1"} and fo.take_renames() == {}
    fo.kill([], ["f/0/0"])
    assert fo.renamed == {"f/0/0": "f/0/0#2"}


class Actor:
    """A fake handle whose ping() returns a ref: a fresh object each time."""

    def __init__(self) -> None:
        self.ping = self
        self.pings = 0

    def remote(self) -> object:
        self.pings += 1
        return object()


def test_the_heartbeat_names_who_has_not_answered_in_time(fake_ray):
    answered: set = set()
    fake_ray(lambda refs, num_returns=1, timeout=None: ([r for r in refs if r in answered], []))
    a, b = Actor(), Actor()
    heartbeat = Heartbeat(timeout=5.0)
    assert heartbeat.hung(["a", "b"], [a, b]) == set() and (a.pings, b.pings) == (1, 1)
    answered.add(heartbeat.pings["a"][0])
    for name in heartbeat.pings:  # six seconds later
        ref, sent = heartbeat.pings[name]
        heartbeat.pings[name] = (ref, sent - 6.0)
    assert heartbeat.hung(["a", "b"], [a, b]) == {"b"}
    assert (a.pings, b.pings) == (2, 1)  # a answered: pinged again; b's ping still out


def test_a_loss_the_replicas_take_over_is_answered_without_waiting_for_more(fake_ray, monkeypatch):
    """confirm's at_once: a replica's death a live replica takes over goes at once (its output gap
    is the wait); any other waits CONFIRM_QUIET_S for the rest of the event (a node's loss)."""
    fo = Failover(run_of(["f/acker", "f/0/0", "f/0/1"]), StandbyPool(0))
    alive = [None, ray.exceptions.RayActorError(), None]
    settled = []
    fake_ray(lambda refs, num_returns=1, timeout=None: ([r for r in refs if r is not None], []))
    monkeypatch.setattr(failover, "settle_answers", lambda *args, **kwargs: settled.append(args) or 1)
    assert fo.confirm(alive, at_once=lambda lost: lost == {"f/0/0"})[0] == {"f/0/0"} and settled == []
    assert fo.confirm(alive)[0] == {"f/0/0"} and len(settled) == 1
