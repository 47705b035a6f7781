"""``verify="majority"`` in the simulator (issue 58, design item 5): the replicas of every keyed
instance vote, epoch by epoch, on what they settled; the primary's sink bundles are written
only once the epoch of their last element is agreed by every instance, and a dissent is
reported and acted on.

- Epochs are the snapshot intervals (:class:`~driftstream.ordering.replica_digests.Epochs`):
  a snapshot's time is known before any replica's watermark reaches it, every replica gets
  a watermark at exactly that time (the marker's, FIFO behind the others), and a vote that
  passes certifies the snapshot taken at its end (its state digest is in the vote). A finer
  epoch would release sooner but certify no snapshot to roll back to.
- Each replica digests what its sinks release, the net of what it sends (its upstream log
  records it, :class:`DigestedLog`) and, at each epoch's end, its folded keyed state
  (:class:`~driftstream.ordering.replica_digests.ReplicaDigest`). Sends stay optimistic (the
  receivers take the primary's stream): what a corrupt primary sent is withheld from every
  sink by the gate (an epoch is released only once every instance passed it).
- An epoch passes when all live replicas that saw it whole agree. A strict majority against
  a *secondary*: the secondary is corrupt (:class:`Dissent`, kind ``"corruption"``), removed
  and replaced (the run's ``due`` action). Against the primary, or no majority (r = 2, or
  all differ): the primary's optimistic output may be in its receivers' settled state, so the
  run rolls back to the newest committed snapshot every instance certified and replays
  (kind ``"corruption"`` or ``"mismatch"``). A second mismatch before the run passes the first
  one's epoch is ``"likely non-determinism"``, with the stage's steps: the instance's output
  is then taken from its primary unverified (a rollback would only repeat it).
- ``verify="sample:N"`` (Warden's optimistic mode, ``sample``: N): no gate, the primary's
  bundles go to the sinks at once (:meth:`SimulatedVotes.hold`); one epoch in N (``k % N ==
  0``) is digested and voted after its output left, the others pass once their end is known.
  A dissent is acted on as above (its ``released`` says the output had left), a rollback to a
  snapshot a vote certified (one at the end of a voted epoch); what the sinks hold is not
  taken back: a corrupt primary's output written before the vote stays.
- ``flip(incarnation, rng)``: a fault for tests: one settled value of a replica's keyed state,
  one bit flipped (:mod:`.simulated_flips`).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("votes")
>>> f.source(MemorySource(range(40), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> config = RunConfig(seed=5, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=3, verify="majority")
>>> sim = Simulation(f.plan(2), config, replica_flips=1)
>>> sorted(sim.run().output("o"))[-2:], [(d.kind, d.replicas == [sim.votes.flips[0].incarnation]) for d in sim.votes.dissents]
([380, 400], [('corruption', True)])
>>> sim.votes.dissents[0].action.startswith("removed; replaced by replica")
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from driftstream.ordering.meta import BOTTOM, TOP
from driftstream.ordering.replica_digests import Epochs, ReplicaDigest, vote

from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.certified_snapshots import CertifiedSnapshots
from driftstream.engine.runtime.replica_votes import DigestedLog, Dissent, host_state_digest
from driftstream.engine.runtime.simulated_flips import SimulatedFlips


@dataclass
class RollBack:
    """What the run does for ``why``: every instance restarts from a certified snapshot."""

    why: Dissent


@dataclass
class Replace:
    """What the run does for ``why``: ``incarnations`` of ``instance`` are removed and replaced."""

    instance: Instance
    incarnations: list
    why: Dissent


class SimulatedVotes:
    """The votes of a run's replicas (``replicas``: its :class:`~.simulated_replicas.SimulatedReplicas`).
    ``passed``: per instance, the epochs it agreed on; ``gate``: the primaries' bundles waiting
    for them; ``dissents``, ``flips``, ``rollbacks``: what happened; ``due``: what the run
    does at its next step (a :class:`Replace` or a :class:`RollBack`). ``sample``: N of
    ``verify="sample:N"`` (None: ``"majority"``); ``tally``: instance epochs voted and not."""

    def __init__(self, plan: Plan, replicas: Any, sample: Optional[int] = None) -> None:
        self.plan, self.replicas, self.sample = plan, replicas, sample
        self.epochs = Epochs(sample or 1)
        self.tally = {"voted": 0, "unvoted": 0}
        #: sample:N: the newest element the sinks were given (after a rollback they skip what they hold)
        self.written: tuple = BOTTOM
        self.digests: dict = {}
        self.reached: dict = {}
        self.passed: dict = {instance: 0 for instance in replicas.replicated}
        self.gate: list = []
        self.dissents: list = []
        #: the faults a test injects (flipped state values) and how each ended
        self.faults = SimulatedFlips(plan, replicas)
        self.rollbacks: list = []
        #: which committed snapshots the votes certified (a rollback's and a replacement's to restore)
        self.certified = CertifiedSnapshots()
        self.unverified: set = set()
        #: what the sinks held at the last rollback (the restored replicas' sinks skip it)
        self.skipped: tuple = BOTTOM
        self.due: Any = None
        #: instance -> the end of the epoch it mismatched on and rolled back for, until the run passes it again
        self.rechecking: dict = {}
        self._settled: dict = {}  # replica -> (the watermark of its last state digest, the digest)

    # -- what the replicas do -------------------------------------------------------------

    def started(self, instance: Instance, inc: Any, host: Any, first: Optional[int] = None) -> None:
        """Replica ``inc`` of ``instance`` started (``host``, its log still empty); it saw whole the
        epochs from ``first`` (default: the next to vote; a replacement's: those that begin at or
        after what the others' sinks skipped at the last rollback, which its own do not)."""
        since = None if first is None or self.skipped == BOTTOM else self.skipped
        digest = self.digests[inc] = ReplicaDigest(self.epochs, self.passed[instance] if first is None else first, since)
        host.recovery.log = DigestedLog(digest)
        self.reached[inc] = BOTTOM

    def released(self, inc: Any, sid: int, bundle: Any) -> None:
        self.digests[inc].released(sid, bundle.elements)

    def hold(self, inc: Any, sink: Any, bundle: Any) -> None:
        """The primary's ``bundle`` waits for its epoch's vote before ``sink`` has it (its host
        took it as written: see simulated_replicas.py); under sample:N it goes at once."""
        if self.sample is not None:
            sink.write(bundle)
            self.written = max(self.written, bundle.t_last)
            return
        self.gate.append((inc, sink, bundle))
        self._open()

    def watermark(self, instance: Instance, inc: Any, host: Any, t: tuple, marker: bool = False) -> None:
        """Replica ``inc``'s watermark reached ``t`` (``marker``: the primary's snapshot marker):
        the epochs it ended get its state digest; votes follow."""
        reached, boundaries = self.reached[inc], self.epochs.boundaries
        if marker and t == reached and t in boundaries and self.epochs.sampled(boundaries.index(t)):
            self._marked(instance, inc, host, boundaries.index(t))
        if t <= reached:
            return
        ended = [k for k, b in enumerate(boundaries) if reached < b <= t]
        if t == TOP:
            ended.append(len(boundaries))
        ended = [k for k in ended if self.epochs.sampled(k)]
        if ended:
            digest = host_state_digest(host)
            self._settled[inc] = (t, digest)
            for k in ended:
                self.digests[inc].ended(k, digest)
        self.reached[inc] = t
        self._vote(instance)

    def _marked(self, instance: Instance, inc: Any, host: Any, k: int) -> None:
        """The primary took snapshot ``k + 1`` after its watermark had reached the snapshot's time:
        the snapshot holds its state now, which must be what it digested then (a settled state
        does not change at one watermark): else it went corrupt in between. Not voted yet, the
        vote sees it; voted, the snapshot is not certified and the run rolls back before it."""
        now = host_state_digest(host)
        if k >= self.passed[instance]:
            self.digests[inc].ended(k, now)
            return
        if now != self._settled.get(inc, (None, now))[1]:
            dissent = Dissent(instance, [inc], k, self.epochs.range(k), {inc: now}, "corruption",
                              [self.plan.steps[sid].name for sid in self.plan.stages[instance.stage].step_ids], released=self.sample is not None)
            self.dissents.append(dissent)
            self.faults.found([inc], "detected")
            self.certified.taint(k + 1)
            if self.due is None:
                self.due = RollBack(dissent)

    def lost(self, instance: Instance, inc: Any, primary: bool = False) -> None:
        """Replica ``inc`` died or was removed: it votes no more, its gated bundles are lost with it.
        ``primary``: it was the primary (the next one promoted already)."""
        self.faults.found([inc], "died")
        successor = self.digests.get(next(iter(self.replicas.sets.get(instance, ())), None))
        if primary and self.sample is not None and successor is not None:
            # its sinks drop what the dead one wrote ahead of it, which the others release: it votes past that alone
            successor.since = self.written if successor.since is None else max(successor.since, self.written)
        self.digests.pop(inc, None)
        self.reached.pop(inc, None)
        self.gate = [g for g in self.gate if g[0] != inc]
        self._vote(instance)

    # -- the run's side ---------------------------------------------------------------------

    def boundary(self, t: tuple) -> None:
        """A snapshot began at ``t``: an epoch ends there (at the bottom: an empty epoch, none)."""
        if t <= BOTTOM or t in self.epochs.boundaries:
            return
        self.epochs.add(t)
        k = len(self.epochs.boundaries) - 1
        for inc, reached in self.reached.items():
            if reached == t and self.epochs.sampled(k):  # the marker's time is a watermark it already has: its settled state is the epoch's end
                self._settled[inc] = (t, host_state_digest(self.replicas.hosts[inc][1]))
                self.digests[inc].ended(k, self._settled[inc][1])

    def commit(self, t: tuple, snapshot_id: int) -> None:
        """The snapshot begun at ``t`` committed: a rollback may restore it once it is certified.
        One taken again at a boundary (after a rollback there) does not replace the first: the
        vote that certifies it saw the state of then, not of a replica restored since."""
        if t in self.epochs.boundaries:
            self.certified.commit(self.epochs.boundaries.index(t) + 1, snapshot_id)

    def frontier(self) -> int:
        """The epochs every instance agreed on: the gate has released what is before them."""
        return min(self.passed.values(), default=0)

    def released_through(self) -> tuple:
        """The time below which the gate released every instance's bundles."""
        k, boundaries = self.frontier(), self.epochs.boundaries
        return BOTTOM if k == 0 else TOP if k > len(boundaries) else boundaries[k - 1]

    def certified_t(self, kept: Optional[set] = None) -> tuple:
        """The time of the newest committed snapshot every instance certified (among ``kept``, as
        :meth:`rollback_target`; the bottom: none)."""
        k = self.rollback_target(kept)[0]
        return BOTTOM if k == 0 else self.epochs.boundaries[k - 1]

    def rollback_target(self, kept: Optional[set] = None) -> tuple:
        """``(epoch, snapshot id)`` of the newest committed snapshot every instance certified
        (among the snapshot ids ``kept``, if given: the store prunes old ones; ``(0, None)``: the beginning).
        Snapshot ``k`` is certified by the vote of epoch ``k - 1``, which sample:N takes one in N."""
        return self.certified.target(self.frontier(), self.epochs.sampled, kept)

    def pinned(self, snapshot_id: int) -> bool:
        """Whether committed snapshot ``snapshot_id`` is one every instance certified (the run's
        store keeps the newest such, as Ray's does under sample:N: a rollback restores it, and
        after a rescale none before it will do; pruned, a vote's rollback went back past it,
        below where the output logs were trimmed, and a step declared ``deterministic=False``
        drew again what the sinks held)."""
        return self.certified.holds(snapshot_id, self.frontier(), self.epochs.sampled)

    def rolled_back(self, epoch: int, snapshot_id: Optional[int], why: Dissent) -> None:
        """The run restarts every instance from the snapshot at the start of ``epoch`` for ``why``."""
        self.rollbacks.append((snapshot_id, why.kind, why.instance, why.epoch))
        why.action = _rolled_back_to(snapshot_id)
        self.restarted(epoch, snapshot_id)

    def restarted(self, epoch: int, snapshot_id: Optional[int]) -> None:
        """Every instance restarts from the snapshot at the start of ``epoch`` (:meth:`rollback_target`):
        a vote's rollback, or a crash's global one. A vote's action still due is the restart's
        (its dissenters are gone with every replica; a rollback it asked for is this one)."""
        if self.due is not None:
            self.due.why.action = _rolled_back_to(snapshot_id) + " (a crash's)"
            self.due = None
        self.skipped = max(self.skipped, self.released_through(), self.written)
        self.faults.found(list(self.digests), "rolled back")
        self.epochs.cut(epoch)
        self.certified.rolled_back(epoch)
        self.passed = {k: epoch for k in self.passed}
        self.digests, self.reached, self.gate, self._settled = {}, {}, [], {}

    def certifies(self, t: tuple) -> bool:
        """Whether a snapshot begun at ``t`` would be certified by a vote of its own: an epoch ends
        at ``t`` only past every boundary so far (one at a boundary again, after a restart, holds
        what the replicas did since that boundary's vote, unvoted), and under sample:N that epoch
        is one of those voted (a rescale waits for one: on Ray its snapshot takes a sampled id)."""
        boundaries = self.epochs.boundaries
        return t > BOTTOM and (not boundaries or t > boundaries[-1]) and self.epochs.sampled(len(boundaries))

    def passed_through(self, t: tuple) -> bool:
        """Whether every instance passed the epochs before ``t`` (a boundary), voting each whose
        replicas all ended it (a drained run's watermark waits at ``t``: no later one votes)."""
        self.resume()
        return self.due is None and self.frontier() >= self.epochs.of(t)

    def resume(self) -> None:
        """Vote every instance whose replicas ended its next epochs: after a due action was taken
        (votes wait while one is due, and at the run's end no watermark comes to ask again)."""
        for instance in list(self.passed):
            self._vote(instance)

    def rescaled(self, plan: Plan, t: tuple, snapshot_id: int) -> None:
        """A rescale restarts every instance of ``plan`` (another parallelism) from snapshot
        ``snapshot_id``, the one begun at boundary ``t`` reassigned, once :meth:`passed_through` it:
        the votes go on from there, and a rollback goes back to it at the earliest (the snapshots
        before it hold the old parallelism's parts)."""
        k = self.epochs.of(t)  # the epoch that begins at t (0: at the bottom, nothing before it)
        self.faults.found(list(self.digests), "rescaled")  # a flip since that epoch's vote goes with its replica
        self.plan = plan
        self.passed = {instance: k for instance in self.replicas.replicated}
        self.certified.rescaled(k, snapshot_id)
        self.digests, self.reached, self.gate, self._settled = {}, {}, [], {}
        self.rechecking, self.unverified = {}, set()

    def report(self) -> list:
        """The dissents as ``metrics.dissents`` shows them (a dict each; instance ``"stage/index"``)."""
        return [d.report() for d in self.dissents]

    def take_due(self) -> Any:
        due, self.due = self.due, None
        return due

    def seeded_flip(self, rng: random.Random) -> bool:
        """A seeded flip (:meth:`.SimulatedFlips.seeded`), none while a mismatch is re-checked (a
        second fault there would pass for non-determinism). Whether one was flipped."""
        return not self.rechecking and self.faults.seeded(rng)

    def flip(self, inc: Any, rng: random.Random) -> Any:
        """:meth:`.SimulatedFlips.flip`: a bit of replica ``inc``'s state flipped, or None."""
        return self.faults.flip(inc, rng)

    @property
    def flips(self) -> list:
        """Every :class:`~.simulated_flips.Flip`, in order."""
        return self.faults.flips

    # -- votes --------------------------------------------------------------------------------

    def _vote(self, instance: Instance) -> None:
        """Vote ``instance``'s next epochs while every voter has ended them."""
        while self.due is None:
            k = self.passed[instance]
            if not self.epochs.sampled(k):  # sample:N: passes once its end is known (its sends then forgotten by time)
                last = len(self.epochs.boundaries)
                if k > last or k == last and any(self.reached[inc] != TOP for inc in self.replicas.sets.get(instance, ())):
                    return
                self._pass(instance, k, [inc for inc in self.replicas.sets.get(instance, ()) if inc in self.digests], "unvoted")
                continue
            voters = [inc for inc in self.replicas.sets.get(instance, ()) if self.digests[inc].covers(k)]
            digests = {inc: self.digests[inc].digest(k) for inc in voters}
            if not voters or None in digests.values():
                return
            outcome = vote(digests)
            if outcome.dissenters and instance not in self.unverified:
                self._dissent(instance, k, digests, outcome)
                if self.due is not None:
                    return
            self._pass(instance, k, voters, "voted")

    def _pass(self, instance: Instance, k: int, voters: list, how: str) -> None:
        """``instance`` passed epoch ``k``: its replicas' hashes of it go, the gate opens."""
        self.tally[how] += 1
        self.passed[instance] = k + 1
        for inc in voters:
            self.digests[inc].forget(k)
        through = self.released_through()
        for key in [key for key, end in self.rechecking.items() if through >= end]:
            del self.rechecking[key]
        self._open()

    def _dissent(self, instance: Instance, k: int, digests: dict, outcome: Any) -> None:
        """Report ``outcome`` of epoch ``k`` and say what the run does about it."""
        primary = self.replicas.sets[instance][0]
        steps = [self.plan.steps[sid].name for sid in self.plan.stages[instance.stage].step_ids]
        kind = outcome.kind
        lo, hi = self.epochs.range(k)
        if kind == "mismatch" and instance in self.rechecking and (lo is None or lo < self.rechecking[instance]):
            kind = "likely non-determinism"
        dissent = Dissent(instance, outcome.dissenters, k, self.epochs.range(k), digests, kind, steps, released=self.sample is not None)
        self.dissents.append(dissent)
        self.faults.found(outcome.dissenters, "detected")
        if kind == "likely non-determinism":
            dissent.action = "the primary's output taken unverified from now on"
            self.unverified.add(instance)
        elif not outcome.rolls_back(primary):
            self.due = Replace(instance, outcome.dissenters, dissent)
        else:
            if kind == "mismatch":
                self.rechecking[instance] = TOP if hi is None else hi
            self.due = RollBack(dissent)

    def _open(self) -> None:
        """Write the gated bundles whose epoch every instance passed."""
        through, of = self.frontier(), self.epochs.of
        keep = []
        for entry in self.gate:
            if of(entry[2].t_last) < through:
                entry[1].write(entry[2])
            else:
                keep.append(entry)
        self.gate = keep


def _rolled_back_to(snapshot_id: Optional[int]) -> str:
    """A dissent's action when the run restarts from ``snapshot_id`` (None: the beginning)."""
    return "rolled back to " + ("the beginning" if snapshot_id is None else f"snapshot {snapshot_id}")
