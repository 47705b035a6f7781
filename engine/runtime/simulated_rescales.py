"""The rescales of a seeded simulator run, as ``FlowHandle.rescale`` does them on Ray.

A rescale goes through three phases: *draining* (the sources stop reading; what they read
settles and is released), *snapshot* (the rescale's own, taken once nothing is in flight:
the sinks then hold exactly the output below its time), and the restart at the next
parallelism from it, its key groups and partitions reassigned
(:mod:`driftstream.engine.model.reassignment`). With replicas every replica restarts, each
from its instance's part; under ``verify="majority"`` a fourth phase, *voting*, comes before the
restart: the gate holds output until every instance passed the snapshot's epoch, and the votes
go on at the new parallelism from there. A crash in any phase, a rollback, or a failover that
gives the snapshot up gives the rescale up until a later seeded moment; it begins again from
the draining.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("rs")
>>> f.source(MemorySource(range(100), partitions=2)).map(lambda x: x + 1).sink(MemorySink("o"))
>>> sim = Simulation(f.plan(2), RunConfig(seed=3, guarantee="exactly-once", snapshot_interval=0.005), rescales=[3])
>>> sim.run().output("o") == list(range(1, 101)), [n for n, _ in sim.rescaling.done]
(True, [3])
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from driftstream.ordering.meta import TOP

from driftstream.engine.model.config import aligned_sources
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.reassignment import reassigned
from driftstream.engine.model.recovery import drained

#: Chance per step that a pending rescale begins (its sources stop reading).
RESCALE_AT = 0.03


class SimulatedRescales:
    """The parallelisms ``sim`` (the :class:`~.simulator.Simulation`) is still to move to (``pending``), the phase of the one under
    way (``phase``: None, "draining", "snapshot" or "voting") and those done (``done``: per rescale, the
    parallelism and the id of the snapshot it restored)."""

    def __init__(self, sim: Any, parallelisms: Sequence[int]) -> None:
        self.sim = sim
        self.pending = list(parallelisms)
        self.phase: Optional[str] = None
        self.done: list = []
        #: the rescale's snapshot, ``(its time, its manifest)``, once committed
        self._drained: tuple = ((), None)

    def maybe_begin(self) -> bool:
        """A seeded step: a pending rescale may begin (True: it did, the step is taken). The
        sources stop reading, each once what it read is sent with its bound (Ray's
        pause_reading): a bound sent later (a source with nothing left to read) would move the
        watermark past the snapshot, and release output after it."""
        sim = self.sim
        if not self.pending or self.phase is not None or sim.restoring or sim.acker.pushed == TOP or sim.rng.random() >= RESCALE_AT:
            return False
        self.phase = "draining"
        for instance in sim.readers:
            sim.incarnation.flush(instance)
        return True

    def due(self, kinds: list) -> Optional[Callable[[], None]]:
        """While draining, once nothing is in flight (``kinds``: the incarnation's deliveries):
        the move that takes the rescale's snapshot (the watermark stays where it is); while
        voting, once every instance passed its epoch: the restart."""
        sim = self.sim
        if (self.phase == "draining" and not kinds and not sim.incarnation.writes and sim.acker.collecting is None
                and not sim.incarnation.logs_due()):  # an ack held for its output log would settle later
            return self._snapshot
        if self.phase == "snapshot" and sim.acker.collecting is None:
            self.phase = None  # a primary's failover gave the snapshot up (its part may be lost)
        if self.phase == "voting":
            if sim.votes.passed_through(self._drained[0]):
                return self._restart
            if not kinds and sim.votes.due is None:
                self.phase = None  # nothing left to move the votes on: read again, begin again later
        return None

    def _snapshot(self) -> None:
        sim = self.sim
        # a replacement's marker would carry the watermark past it (local recovery's, or a replica's)
        catching_up = (sim.local is not None and sim.local.busy(sim.acker)) or (sim.replicas is not None and sim.replicas.replacements.catching_up)
        # under votes the snapshot a rescale restarts from must be certified, by a vote of its own epoch
        voted = sim.votes is None or sim.votes.certifies(sim.acker.table.watermark)
        if not catching_up and voted and sim.acker.table.settled() and drained(sim.acker.pushed, (rt.t_last() for rt in sim.stages.values())):
            self.phase = "snapshot"
            sim._begin_snapshot()
        else:  # the sinks hold output a recovery has not replayed yet (or it did not settle): go on, try again later
            self.phase = None

    def crashed(self, point: str) -> str:
        """A crash struck at ``point``: the rescale under way (if any) is given up, to begin
        again later (its snapshot, if begun, too); ``point`` as the crash records it."""
        phase, self.phase = self.phase, None
        return point if phase is None else f"{point} (rescale {phase})"

    def given_up(self) -> None:
        """The run rolls back or restarts every instance: the rescale under way (if any) begins again later."""
        self.phase = None

    def committed(self, manifest: Manifest) -> None:
        """A snapshot committed: if it is the rescale's, restart at the next parallelism from
        it (under votes once every instance passed its epoch: the gate still holds output
        below it, and a restart would lose it)."""
        if self.phase != "snapshot":
            return
        self._drained = (tuple(manifest.t), manifest)
        if self.sim.votes is not None and not self.sim.votes.passed_through(self._drained[0]):
            self.phase = "voting"
            return
        self._restart()

    def _restart(self) -> None:
        """Every instance restarts at the next parallelism from the rescale's snapshot, reassigned.
        The reassigned manifest is committed first, so a crash from here on restores at the new
        parallelism, whose routing wrote any output past the snapshot."""
        sim = self.sim
        t, manifest = self._drained
        plan = sim.plan.with_parallelism(self.pending.pop(0))
        sim.stop_every_instance(plan)
        sim.plan = plan
        sim.aligned = aligned_sources(plan, sim.config.source_alignment)
        sid = sim.next_snapshot_id
        sim.next_snapshot_id += 1
        moved = reassigned(manifest, plan, sid)
        sim.store.write_manifest(sid, moved.to_json())
        self.done.append((plan.parallelism, manifest.snapshot_id))
        if sim.votes is not None:
            sim.votes.rescaled(plan, t, sid)
        sim._start_incarnation(moved, recovering=True, rescaled=True)
