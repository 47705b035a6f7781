"""The seeded crashes of a simulated run (``crashes=``; see simulator.py): where each strikes and
what the run does about it. Without ``recovery="local"`` a crash loses every instance and message
in flight, and the run restarts from the newest committed manifest; under it, a crash fails one
seeded instance, which alone restores (local_recovery.py), unless the moment or the victim
refuses that (local_refusals.py): then the run rolls back globally and says why. With votes a
global rollback restores the newest snapshot they certified (:mod:`.restore_points`).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("crashes")
>>> f.source(MemorySource(range(40), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> sim = Simulation(f.plan(2), RunConfig(seed=3, guarantee="exactly-once", snapshot_interval=0.004), crashes=2)
>>> sorted(sim.run().output("o"))[-1], len(sim.crashes.points) == len(sim.crashes.recoveries) == 2 - sim.crashes.left
(400, True)
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.local_refusals import crash_refusal, victim_refusal
from driftstream.engine.runtime.simulated_incarnation import CRASH_AT_POINT


class SimulatedCrashes:
    """The ``left`` crashes still to strike ``sim`` (a :class:`~.simulator.Simulation`);
    ``points``: where each struck, ``recoveries``: the snapshot id each restart restored (None:
    the beginning), ``failed``: under ``recovery="local"``, the instances that failed alone."""

    def __init__(self, sim: Any, crashes: int) -> None:
        self.sim, self.left = sim, crashes
        self.points: list = []
        self.recoveries: list = []
        self.failed: list = []

    def maybe(self, point: str, chance: float = CRASH_AT_POINT) -> bool:
        """A crash at ``point`` with ``chance`` while crashes remain; whether one struck."""
        if self.left and self.sim.rng.random() < chance:
            self.crash(point)
            return True
        return False

    def crash(self, point: str) -> None:
        """Every instance and message in flight is lost and the run restarts; under
        recovery="local" that is the fallback for what cannot be recovered locally (see
        local_refusals.py); any other crash fails one instance (:meth:`_fail_one`)."""
        sim, why = self.sim, None
        if sim.local is not None:
            why = crash_refusal(sim.local, sim.acker, sim.replicas, bool(sim.restoring))
            if why is None:
                victim = sim.rng.choice(sorted(sim.live.hosts))
                why = None if sim.replicas is None else victim_refusal(victim, sim.replicas.sets)
                if why is None:
                    self._fail_one(point, victim)
                    return
        sim.restart_all(self._count(point, sim.restore.restart()), why)

    def _fail_one(self, point: str, victim: Instance) -> None:
        """recovery="local": ``victim`` fails and alone restores what Ray's would
        (:meth:`.RestorePoints.local`); the others go on (see local_recovery.py),
        every replica of theirs taking its part."""
        sim = self.sim
        manifest = self._count(point, sim.restore.local())
        self.failed.append(victim)
        sim.landed += sim.local.fail(victim, sim.incarnation, manifest, lambda instance, m: sim.start_instance(instance, m, recovering=True),
                                     sim.resets_in_place, None if sim.replicas is None else sim.replicas.peers_of(victim))

    def _count(self, point: str, manifest: Optional[Manifest]) -> Optional[Manifest]:
        """Record a crash at ``point`` whose restart restores ``manifest`` (a pending rescale begins
        again later: its snapshot, if begun, is given up); returns ``manifest``."""
        self.left -= 1
        self.points.append(self.sim.rescaling.crashed(point))
        self.recoveries.append(None if manifest is None else manifest.snapshot_id)
        return manifest
