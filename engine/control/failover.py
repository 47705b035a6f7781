"""Failure detection and recovery on Ray: which actors are lost, and bringing the run back
from the newest manifest. The rules of a (re)start are pure and live in
:mod:`driftstream.engine.model.recovery`; this applies them to actors.

An actor's death is seen at once (the supervisor holds a never-returning ``alive()`` call
on every actor); one that hangs is found by its missed pings (:class:`Heartbeat`).
Every actor of the run is then stopped and started again from the newest manifest:
survivors reset in place, standbys and new actors for the lost. Under exactly-once each
barrier first asks its sink for the last bundle it holds and drops replayed output at or
before it.

>>> steps = recovery_steps(detected=10.0, entered=10.02, probed=10.03, killed=10.05, marks=[10.06, 10.16, 10.18, 10.19])
>>> {k: round(v, 3) for k, v in steps.items()}
{'confirm': 0.02, 'probe': 0.01, 'kill': 0.02, 'read_manifest': 0.01, 'reset': 0.1, 'connect': 0.02, 'start': 0.01}
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import ray

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.control.launcher import Launcher, first_release_of
from driftstream.engine.control.standbys import StandbyPool
from driftstream.engine.runtime.ray_session import kill_actors

#: Seconds after a recovery that used a standby before a new standby is started: its
#: process start (about a second of CPU) must not slow the replay that catches up.
STANDBY_REPLENISH_DELAY_S = 2.0

#: Seconds a recovery waits for a lost actor's name to be free before its replacement takes
#: another: Ray frees it at once for a killed actor, only after a health check (~14 s) for
#: one on a node that vanished.
NAME_WAIT_S = 1.0

#: After a first actor is seen dead, the others' alive() answers are awaited until none came
#: for CONFIRM_QUIET_S (the lost one's peers answer as their connections to it end, within
#: milliseconds), at most CONFIRM_S: one recovery then takes every actor one event killed.
#: A fixed wait of CONFIRM_S was 100 of the 220 ms from a kill to restored with a standby.
CONFIRM_QUIET_S, CONFIRM_S = 0.02, 0.1


class Hung(Exception):
    """Actors that did not answer within the heartbeat timeout: they are killed and replaced."""

    def __init__(self, names: set) -> None:
        super().__init__(f"no answer from {sorted(names)}")
        self.names = names


@dataclass
class Recovery:
    """One recovery: when the failure was detected (wall time), seconds from then until
    every actor was restored and running, and until the first new output was released."""

    detected_at: float
    restored_s: float = 0.0
    snapshot_id: Optional[int] = None
    first_output_s: Optional[float] = None
    pending: Optional[list] = None  # refs of first_release() calls, resolved lazily
    #: where ``restored_s`` went, in order: ``confirm`` (the other actors' answers: is anyone
    #: else lost?), ``probe`` (are their nodes alive?), ``kill`` (lost actors killed, names
    #: freed), ``reset`` (survivors reset in place, standbys and new actors restored),
    #: ``connect`` (data plane up, windows' timers seeded) and ``start`` (sources reading)
    steps_s: dict = field(default_factory=dict)
    #: per stage instance reset in place (a survivor, or a standby taking a lost one's place):
    #: seconds of ``tear_down``, ``setup`` and ``restore`` (within setup)
    resets_s: dict = field(default_factory=dict)
    #: ``"global"`` (every instance rolled back), ``"local"`` (only ``restored``) or, under
    #: recovery="local", ``"global (fallback: why)"``
    kind: str = "global"
    #: the instances that restored (labels; None: every one)
    restored: Optional[list] = None

    def to_dict(self) -> dict:
        """The record as ``status()["recoveries"]`` and ``metrics.recovery_s`` hold it (one form).

        >>> Recovery(10.0, 1.5, 3, 2.0, steps_s={"confirm": 0.5}).to_dict()
        {'detected_at': 10.0, 'restored_s': 1.5, 'first_output_s': 2.0, 'snapshot': 3, 'steps_s': {'confirm': 0.5}, 'resets_s': {}, 'kind': 'global', 'restored': None}
        """
        return {"detected_at": self.detected_at, "restored_s": self.restored_s, "first_output_s": self.first_output_s,
                "snapshot": self.snapshot_id, "steps_s": dict(self.steps_s), "resets_s": dict(self.resets_s), "kind": self.kind,
                "restored": None if self.restored is None else list(self.restored)}


class Failover:
    """Finds the lost actors of ``launcher``'s run and brings the run back (:meth:`recover`);
    keeps every recovery (``recoveries``) and what the next launch must know of the last:
    the names still held (``renamed``) and the nodes to avoid (``avoid_nodes``)."""

    def __init__(self, launcher: Launcher, standbys: StandbyPool) -> None:
        self.launcher = launcher
        self.standbys = standbys
        self.recoveries: list = []
        #: for the next launch: actor name -> the name its new actor takes (the name still held)
        self.renamed: dict = {}
        self._renames = 0
        #: nodes that lost actors in the last recovery and kept none: new actors go elsewhere
        self.avoid_nodes: set = set()

    def confirm(self, alive: list, at_once: Optional[Callable[[set], bool]] = None) -> tuple:
        """``(names of the lost actors, wall time the loss was seen)``, once one of the
        ``alive()`` calls ``alive`` (one per actor, in launch order) has answered or failed.
        ``at_once(lost)``: whether the first loss seen is answered without waiting for more (a
        replica's death that a live replica takes over: its output gap is the wait); None: never."""
        seen = time.time()
        # A call that saw the death may beat the alive() ref; actors that shared the dead
        # one's node go a few milliseconds apart: take them all in one recovery.
        ready, _ = ray.wait(alive, num_returns=1, timeout=2.0)
        if ready and at_once is not None:
            lost = self.lost(alive)
            if lost and at_once(lost):
                return lost, seen
        settle_answers(alive, len(ready), seen + CONFIRM_S)
        return self.lost(alive), seen

    def lost(self, alive: list) -> set:
        """The actors that died, from the ``alive()`` calls that answered: a call fails when its
        actor died, and returns the peers its actor saw die (their connections ended)."""
        names = self.launcher.names
        lost = set()
        answered = {id(r) for r in ray.wait(alive, num_returns=len(alive), timeout=0)[0]} if alive else set()  # one call, not one a ref
        for name, ref in zip(names, alive):
            if id(ref) in answered:
                try:
                    lost.update(n for n in ray.get(ref) if n in names)
                except ray.exceptions.RayActorError:
                    lost.add(name)
        return lost

    def recover(self, dead: Optional[set], detected: Optional[float], relaunch: Callable[[dict], Optional[Manifest]]) -> Recovery:
        """Replace the ``dead`` actors (None: every one) and restart the run: ``relaunch``
        launches from the newest manifest with the survivors it is given (actor name ->
        handle) and returns that manifest. ``detected``: when the loss was seen."""
        run = self.launcher
        entered = time.time()
        detected = detected or entered
        dead = set(run.names) if dead is None else set(dead)
        # A node whose raylet does not answer is gone with every actor on it, though Ray says so
        # only after its health check (~14 s): its actors that still answer are dying too.
        gone = unreachable_nodes({run.node_of[n] for n in run.names if n in run.node_of})
        dead |= {n for n in run.names if run.node_of.get(n) in gone}
        probed = time.time()
        lost = [n for n in run.names if n in dead]
        # A node with a surviving actor is alive; one whose actors all died may be gone (its
        # death known to Ray only after a health check): new actors go elsewhere.
        survived_on = {run.node_of.get(n) for n in run.names if n not in dead}
        self.avoid_nodes = {run.node_of[n] for n in lost if n in run.node_of} - survived_on
        # Only a name a new actor takes must be free first; a standby keeps its own.
        self.standbys.drop_on(self.avoid_nodes)
        by_standby = [n for n in lost if n != run.names[0]][:len(self.standbys)]  # names[0]: the acker
        self.kill(run.handles_of(dead), [n for n in lost if n not in by_standby])
        survivors = {n: h for n, h in zip(run.names, run.handles) if n not in dead}
        killed = time.time()
        manifest = relaunch(survivors)
        recovery = Recovery(detected, time.time() - detected, None if manifest is None else manifest.snapshot_id,
                            pending=[a.first_release.remote() for a in run.sinks()],
                            steps_s=recovery_steps(detected, entered, probed, killed, run.marks), resets_s=run.resets)
        self.recoveries.append(recovery)
        self.standbys.delay(STANDBY_REPLENISH_DELAY_S)
        return recovery

    def count_restart(self, manifest: Optional[Manifest]) -> None:
        """Count a launch an actor's death cut short, started again from ``manifest``, as a recovery."""
        self.recoveries.append(Recovery(time.time(), 0.0, None if manifest is None else manifest.snapshot_id))

    def kill(self, handles: list, names: list) -> None:
        """Kill ``handles``; the actors of ``names`` will be replaced by new ones: a name Ray
        still holds after NAME_WAIT_S (its node vanished) is taken as ``<name>#<n>`` instead."""
        taken = kill_actors(handles, self.launcher.actor_names(names), wait_s=NAME_WAIT_S)
        self._renames += 1
        self.renamed = {n: f"{n}#{self._renames}" for n in names if self.launcher.real_names.get(n, n) in taken}

    def take_renames(self) -> dict:
        """The names the next launch's new actors take instead of their own; then none."""
        renamed, self.renamed = self.renamed, {}
        return renamed

    def resolve(self) -> None:
        """Fill in first_output_s of recoveries whose first output has been released."""
        for r in list(self.recoveries):
            pending = r.pending  # status() may resolve it on another thread meanwhile
            first = first_release_of(pending) if pending else None
            if first is not None:
                r.first_output_s, r.pending = first - r.detected_at, None


def recovery_steps(detected: float, entered: float, probed: float, killed: float, marks: list) -> dict:
    """Seconds of each step of a recovery (see :attr:`Recovery.steps_s`), from the wall times
    it reached them and the launch's ``marks`` (begun, reset, connected, started)."""
    steps = {"confirm": entered - detected, "probe": probed - entered, "kill": killed - probed, "read_manifest": marks[0] - killed}
    steps.update(zip(("reset", "connect", "start"), (b - a for a, b in zip(marks, marks[1:]))))
    return steps


class Heartbeat:
    """Pings every actor about once a second; :meth:`hung` names those that have not answered
    for ``timeout`` seconds (hung, e.g. a user function that never returns)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.pings: dict = {}  # actor name -> (ping ref, sent at)

    def hung(self, names: list, handles: list) -> set:
        """Ping who is due; the names of the actors whose ping is overdue.

        One ``ray.wait`` over every outstanding ping per call: the watch loop runs this at
        every turn, a turn per snapshot interval or less."""
        now = time.time()
        outstanding = [sent[0] for sent in self.pings.values()]
        answered = set(ray.wait(outstanding, num_returns=len(outstanding), timeout=0)[0]) if outstanding else set()
        hung = set()
        for name, handle in zip(names, handles):
            sent = self.pings.get(name)
            if sent is None or (sent[0] in answered and now - sent[1] >= 1.0):
                self.pings[name] = (handle.ping.remote(), now)
            elif sent[0] not in answered and now - sent[1] > self.timeout:
                hung.add(name)
        return hung


def settle_answers(refs: list, answered: int, deadline: float, quiet: float = CONFIRM_QUIET_S) -> int:
    """Wait while more of ``refs`` keep answering: until none has for ``quiet`` seconds, all
    have, or ``deadline`` (wall time) passes. ``answered``: how many had when called.
    Returns how many have."""
    while 0 < answered < len(refs):
        left = deadline - time.time()
        if left <= 0:
            break
        ready, _ = ray.wait(refs, num_returns=answered + 1, timeout=min(quiet, left))
        if len(ready) <= answered:
            break
        answered = len(ready)
    return answered


def unreachable_nodes(nodes: set, timeout: float = 0.5) -> set:
    """The nodes among ``nodes`` whose raylet does not accept a TCP connection within
    ``timeout`` (refused at once when its process died; a timeout when its machine is gone)."""
    gone = set()
    for info in ray.nodes():
        if info["NodeID"] in nodes and info.get("Alive"):
            try:
                socket.create_connection((info["NodeManagerAddress"], info["NodeManagerPort"]), timeout=timeout).close()
            except OSError:
                gone.add(info["NodeID"])
        elif info["NodeID"] in nodes:
            gone.add(info["NodeID"])
    return gone
