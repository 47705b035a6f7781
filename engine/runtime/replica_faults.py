"""The seeded faults of a simulated run's replicas, and what the run does about what the votes
found (``replicas`` > 1; see simulated_replicas.py and simulated_votes.py): at a step, a
replica's death (``replica_crashes``: a dead replica is replaced; while a local recovery of a
``crashes=`` crash is under way, a global rollback instead, as on Ray: local_refusals.py),
a dissent's action (its dissenters removed and replaced, or a global rollback), or a value
flipped in a replica's state (``replica_flips``).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("faults")
>>> f.source(MemorySource(range(40), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> config = RunConfig(seed=4, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=3, verify="majority")
>>> sim = Simulation(f.plan(2), config, replica_crashes=2)
>>> out = sim.run().output("o")
>>> len(sim.replicas.failures) == len(sim.replicas.replacements.started), {len(incs) for incs in sim.replicas.sets.values()}
(True, {3})
"""

from __future__ import annotations

from typing import Any

from driftstream.engine.runtime.local_refusals import recovery_refusal
from driftstream.engine.runtime.simulated_votes import RollBack

#: Chance of a replica's death at any step while replica crashes remain.
REPLICA_CRASH_ANY = 0.02
#: The same in a run with ``crashes=`` too: the crashes' chance (CRASH_ANY in simulator.py), so
#: that deaths and crashes interleave (at REPLICA_CRASH_ANY the deaths come first nearly always).
REPLICA_CRASH_BESIDE_CRASHES = 0.004

#: Chance of a value flip in a replica's state at any step while flips remain (verify="majority").
REPLICA_FLIP_ANY = 0.05


class ReplicaFaults:
    """The replica faults of ``sim`` (a :class:`~.simulator.Simulation` with replicas):
    ``crashes_left`` deaths and ``flips_left`` flips still to strike."""

    def __init__(self, sim: Any, crashes: int, flips: int) -> None:
        self.sim, self.crashes_left, self.flips_left = sim, crashes, flips
        #: deaths that fell back to a global rollback (a local recovery was under way)
        self.fallbacks = 0
        self.chance = REPLICA_CRASH_BESIDE_CRASHES if sim.crashes.left else REPLICA_CRASH_ANY

    def step(self) -> bool:
        """One seeded fault, or a vote's action; whether the step was taken."""
        sim = self.sim
        replicas, votes, rng = sim.replicas, sim.votes, sim.rng
        if self.crashes_left and not sim.restoring and replicas.can_fail() and rng.random() < self.chance:
            self.crashes_left -= 1
            why = recovery_refusal(sim.local, sim.acker)
            if why is not None:  # as on Ray: a local recovery under way (crashes=) cannot take a failover's cut
                self._fall_back(why)
                return True
            instance, _, _ = replicas.fail_one(rng, sim.rules.settings["batch_size"])
            if votes is None or votes.due is None:  # (a due rollback restarts every replica anyway)
                self._replace(instance)
            return True
        if votes is None:
            return False
        if votes.due is not None:
            self._act(votes.take_due())
            return True
        if self.flips_left and not sim.restoring and rng.random() < REPLICA_FLIP_ANY:
            self.flips_left -= votes.seeded_flip(rng)
            return True
        return False

    def _fall_back(self, why: str) -> None:
        """A seeded replica dies while a local recovery is under way (``why``): every instance
        and replica rolls back (:meth:`.RestorePoints.restart`)."""
        sim, rng = self.sim, self.sim.rng
        self.fallbacks += 1
        instance = rng.choice(sim.replicas.can_lose())
        sim.restart_all(sim.restore.restart(), f"replica {rng.choice(sim.replicas.sets[instance])} of {instance.label} died; {why}")

    def kill(self, instance: Any, incarnation: Any) -> str:
        """Kill replica ``incarnation`` of ``instance`` (a test's hook; it must have a live
        one beside it) and replace it; what was done."""
        self.sim.replicas.fail(instance, incarnation, self.sim.rules.settings["batch_size"])
        return "killed; " + self._replace(instance)

    def _act(self, due: Any) -> None:
        """A dissent's action: a rollback (the run's), or its dissenters removed and replaced."""
        if type(due) is RollBack:
            self.sim.roll_back(due.why)
            return
        for inc in due.incarnations:
            self.sim.replicas.fail(due.instance, inc, self.sim.rules.settings["batch_size"])
        due.why.action = "removed; " + ", ".join(self._replace(due.instance) for _ in due.incarnations)
        self.sim.votes.resume()  # the other instances' votes waited for this action

    def _replace(self, instance: Any) -> str:
        """A new replica of ``instance`` (see replica_replacements.py); what was done."""
        sim = self.sim
        return sim.replicas.replacements.replace(sim.plan, instance, sim.store, sim.rules, sim.rng, sim.base_every_s)
