"""The simulator runtime: the whole flow in one process, under a seeded adversarial
scheduler, with snapshots, crashes and recovery.

Every step of a run is one scheduling decision, drawn from a seeded generator:
deliver a data batch (in any order, across and within channels), deliver a control
message (acks to the acker, watermarks and snapshot markers from it: FIFO per
sender, as on the data plane's connections), read a source chunk of random size,
complete a sink write, write a snapshot to the store, start a snapshot, commit
one, restore an instance after a crash, or crash. Because the output of a run is a
function of its input alone, every seed must give the same output: that is what
the property tests check.

Under a guarantee, the run takes snapshots into a real snapshot store (RocksDB
files in a directory) every ``snapshot_interval`` seconds of simulated time (one
step is a millisecond), and ``crashes`` seeded crashes hit it, at any step or at the
protocol's critical points (:data:`CRASH_POINTS`). A crash loses every instance
and every message in flight, as a recovery on Ray does; sink partitions survive,
as a broker's topic does. The instances restart from the newest manifest one step
at a time (a crash can strike mid-restore) under the same rules as on Ray
(:mod:`driftstream.engine.model.recovery`).

Under ``recovery="local"`` a crash fails one seeded instance, which alone restores
(:mod:`.local_recovery`), its peers' replicas too taking their part when the run has replicas;
what cannot be recovered locally (a crash of an instance with replicas, which kills every
replica of it; any failure while a local recovery is under way: :mod:`.local_refusals`) falls
back to a global rollback of every instance and replica, and says why (``fallback_reasons``).

``rescales``: parallelisms the run moves to, one after the other, each at a seeded
moment, as ``FlowHandle.rescale`` does on Ray: the sources stop reading, everything
read settles and is released, a snapshot is taken (the sinks then hold exactly the
output below its time), and the run restarts at the new parallelism from it, its key
groups and partitions reassigned (:mod:`driftstream.engine.model.reassignment`).
Crashes strike before, during and after it.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("sim")
>>> f.source(MemorySource(range(5), partitions=2)).map(lambda x: x * 10).sink(MemorySink("o"))
>>> {tuple(run_simulated(f.plan(2), RunConfig(seed=s)).output("o")) for s in range(5)}
{(0, 10, 20, 30, 40)}
>>> eo = RunConfig(seed=1, guarantee="exactly-once", snapshot_interval=0.005)
>>> run_simulated(f.plan(2), eo, crashes=2).output("o")
[0, 10, 20, 30, 40]
>>> run_simulated(f.plan(2), eo, crashes=1, rescales=[3, 1]).output("o")
[0, 10, 20, 30, 40]
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import Any, Callable, Optional, Sequence

from driftstream.ordering.meta import TOP
from driftstream.snapshots.output_segments import discard_outputs
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import RunConfig, aligned_sources, reexecute_every, vote_sample
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import Manifest, committed_t, manifest_of
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.recovery import RecoveryRules, replay_limit
from driftstream.engine.model.result import RunResult
from driftstream.engine.runtime.local_recovery import LocalRecovery
from driftstream.engine.runtime.output_logs import trim_logs
from driftstream.engine.runtime.reexecuted_step import SilentCorruption
from driftstream.engine.runtime.simulated_corruptions import SimulatedCorruptions
from driftstream.engine.runtime.simulated_crashes import SimulatedCrashes
from driftstream.engine.runtime.simulated_incarnation import SimulatedIncarnation
from driftstream.engine.runtime.simulated_instances import SimulatedInstances
from driftstream.engine.runtime.simulated_replicas import SimulatedReplicas
from driftstream.engine.runtime.simulated_rescales import SimulatedRescales
from driftstream.engine.runtime.replica_replacements import ReplicaReplacements
from driftstream.engine.runtime.restore_points import RestorePoints
from driftstream.engine.runtime.replica_faults import ReplicaFaults
from driftstream.engine.runtime.simulated_votes import SimulatedVotes

#: What the simulator's scheduler gets when the run does not say: small batches and credit,
#: so that there are many interleavings for it to choose from.
SIMULATOR_BATCH_SIZE, SIMULATOR_MAX_INFLIGHT = 8, 64

#: Where a seeded crash may strike: at any step, or right at a moment of the protocol
#: where a wrong rule would lose or duplicate output.
CRASH_POINTS = ("any step", "after a marker", "between prepared and commit", "after a commit", "during restore")

#: Chance of a crash at any step while crashes remain (at a critical point: CRASH_AT_POINT,
#: in simulated_incarnation.py, where the marker's is tried).
CRASH_ANY = 0.004

class Simulation:
    """One seeded run across its incarnations: ``step()`` performs one scheduling decision,
    ``run()`` runs to the end. This is the run's lifecycle (an incarnation's start and its
    instances' restores, crashes, rescales, snapshots begun and committed, the result); the
    moves within an incarnation are its :class:`~.simulated_incarnation.SimulatedIncarnation`'s.

    ``crashes``: how many seeded crashes strike the run (it needs a guarantee: a run without
    snapshots has nothing to recover from); ``crash_points`` lists where each struck.
    ``resets_in_place``: each crash is a reset of the live instances in place, as Ray resets
    survivors (the same :class:`~.instance_host.InstanceHost` teardown and setup; the sink
    writes in progress land before the restart instead of being lost). ``acker_shards``: that
    many :class:`~.acker_shard.AckShardHost` fold the instances' messages to the acker (round
    robin), flush when the scheduler says, and pass the acker's watermarks and markers on.
    ``replica_crashes`` (``replicas`` > 1): how many seeded deaths of one replica strike the run
    (see simulated_replicas.py), listed in ``replicas.failures``; none restores anything (one
    during a local recovery of a crash rolls back globally: local_refusals.py).
    ``replica_flips`` (``verify="majority"``): how many seeded value flips strike a replica's
    state (see simulated_votes.py), listed in ``votes.flips``; ``votes.dissents`` says what the
    votes found and did.
    """

    def __init__(self, plan: Plan, config: Optional[RunConfig] = None, crashes: int = 0, rescales: Sequence[int] = (),
                 resets_in_place: bool = False, acker_shards: int = 0, replica_crashes: int = 0, replica_flips: int = 0) -> None:
        config = config or RunConfig()
        #: acker shards between the instances and the acker (0: none; see SimulatedAcker)
        self.shard_count = acker_shards
        #: crashes are resets in place (see simulated_crashes.py); ``landed``: the sink writes that finished in one
        self.resets_in_place, self.landed = resets_in_place, 0
        _refuse_impossible(plan, config, crashes, rescales, replica_crashes)
        if replica_flips and config.verify != "majority" and vote_sample(config.verify) is None:
            raise FlowError("replica_flips need verify='majority' or 'sample:N': with verify='first' nothing compares the replicas")
        #: the rescales still to come, the phase of the one under way, and those done (see simulated_rescales.py)
        self.rescaling = SimulatedRescales(self, rescales)
        self.plan, self.config = plan, config
        self.rng = random.Random(config.seed)
        self.clock_value, self.steps_taken = 0.0, 0
        #: the seeded crashes still to strike, where each struck and what it restored (see simulated_crashes.py)
        self.crashes = SimulatedCrashes(self, crashes)
        self.commits = self.skipped = 0
        #: per instance: its restores from a snapshot after a crash
        self.restores: Counter = Counter()
        #: recovery="local": a crash fails one instance, which alone restores (see local_recovery.py)
        self.local = LocalRecovery(plan) if config.recovery == "local" else None
        #: recovery="local": failures that fell back to a global rollback and why each (see local_refusals.py)
        self.fallbacks, self.fallback_reasons = 0, []
        self.live = SimulatedInstances(clock=lambda: self.clock_value)
        #: replicas > 1: the replicated instances' replicas (see simulated_replicas.py), None by default
        self.replicas = None
        try:  # from here on a refusal (replicas that do not fit the flow) or a failure leaves no scratch directory
            if config.replica_count > 1:
                self.replicas = SimulatedReplicas(plan, config, self.local, self.live)
            #: verify="majority" or "sample:N": the replicas' votes (see simulated_votes.py), None by default
            self.votes = None if config.verify != "majority" and vote_sample(config.verify) is None else SimulatedVotes(plan, self.replicas, vote_sample(config.verify))
            if self.replicas is not None:  # a lost replica is replaced (replica_replacements.py)
                self.replicas.votes, self.replicas.replacements = self.votes, ReplicaReplacements(self.replicas)
            #: replicas > 1: their seeded deaths and flips, and what the votes found done (see replica_faults.py)
            self.replica_faults = None if self.replicas is None else ReplicaFaults(self, replica_crashes, replica_flips)
            #: verify="reexecute:N": the silent corruptions caught and the rollbacks they caused (None by default)
            self.corruptions = None if reexecute_every(config.verify) is None else SimulatedCorruptions(self)
            self.snapshot_dir, self.store = _fresh_store(config, self.live.scratch, None if self.votes is None else self.votes.pinned)
            #: which snapshot each recovery restores (see restore_points.py)
            self.restore = RestorePoints(self.store, self.votes)
            self.rules = RecoveryRules(config, self.snapshot_dir, {"batch_size": SIMULATOR_BATCH_SIZE, "max_inflight": SIMULATOR_MAX_INFLIGHT})
            # Every snapshot a base, or bases rarely (deltas in between): both restore paths get seeds.
            self.base_every_s = self.rng.choice([0.0, 3600.0])
            self.next_snapshot_id, self.next_snapshot_at = 1, config.snapshot_interval
            self.aligned = aligned_sources(plan, config.source_alignment)  # (instance, group) told frontiers
            self._start_incarnation(manifest=None, recovering=False)
            while self.restoring:
                self._restore_one()
        except BaseException:
            self.close()  # e.g. a source that cannot open, or replicas refused: nothing is left in the scratch directory
            raise

    @property
    def stages(self) -> dict:
        return self.live.stages

    @property
    def readers(self) -> dict:
        return self.live.readers

    @property
    def crash_points(self) -> list:
        """Where each seeded crash struck (:attr:`SimulatedCrashes.points`)."""
        return self.crashes.points

    @property
    def failed(self) -> list:
        """recovery="local": the instances that failed alone, in order."""
        return self.crashes.failed

    @property
    def recoveries(self) -> list:
        """Per crash: the snapshot id its restart restored (None: the beginning)."""
        return self.crashes.recoveries

    # -- incarnations ---------------------------------------------------------------------

    def _start_incarnation(self, manifest: Optional[Manifest], recovering: bool, rescaled: bool = False) -> None:
        """Forget everything in flight; instances are then restored one per step (``rescaled``: a
        rescale's restart, whose restores are no recovery's: ``restores`` counts none, as on Ray)."""
        self.manifest, self.recovering, self.rescaled = manifest, recovering, rescaled
        self.restoring = list(self.plan.instances)
        # late-bound: what replaces _send_control (a test's recorder) sees the acker's messages too
        self.incarnation = SimulatedIncarnation(self.plan, self.live, self.rng, self.rules.settings["batch_size"], self.aligned, self.shard_count,
                                                lambda *message: self._send_control(*message), self.crashes.maybe, self.local, self.replicas)
        #: the incarnation's acker and its shards; ``acker``: the root, what the lifecycle reads
        self.ackers, self.acker = self.incarnation.ackers, self.incarnation.acker

    def _send_control(self, sender, receiver, message) -> None:
        """A control message joins its queue in the incarnation (the run's method: a test's recorder replaces it)."""
        self.incarnation.enqueue(sender, receiver, message)

    def _restore_one(self) -> None:
        """Start the next instance of the incarnation from the manifest (a scheduling step)."""
        instance = self.restoring.pop(0)
        self.start_instance(instance, self.manifest, self.recovering, counted=not self.rescaled)
        if not self.restoring and self.recovering and self.rules.skips_backlog:
            limit = replay_limit(rt.t_last() for rt in self.stages.values())
            self.skipped += sum(r.skip_after(limit) for r in self.readers.values())

    def start_instance(self, instance, manifest: Optional[Manifest], recovering: bool, counted: bool = True) -> None:
        """Start ``instance`` from its part of ``manifest`` (None: the beginning); ``counted``: a
        restore (``recovering``) counts in ``restores``."""
        ordinal = self.plan.instances.index(instance)
        config = self.rules.instance_config(instance, ordinal, manifest, recovering)
        if self.replicas is not None and instance in self.replicas.replicated:  # (its timers seeded below: a rollback restores its windows)
            host = self.replicas.start(self.plan, instance, config, self.rng, self.base_every_s)
        else:
            extra = {} if self.local is None else {"incarnations": self.local.incarnations}
            host = self.live.start(self.plan, instance, config, self.rng.getrandbits(32), self.base_every_s,
                                   self.incarnation.bundle_writer(instance), self.incarnation.sender(instance), **extra)
        if recovering and counted:
            self.restores[instance] += 1
        if self.local is not None:
            self.local.started(instance, host)
        seed = host.rt.take_seed()  # restored windows' timers, in the table before any source starts
        if seed:
            self.acker.seed(seed if self.local is None else host.recovery.tag(seed))

    def restart_all(self, manifest: Optional[Manifest], why: Optional[str] = None) -> None:
        """A global rollback: every instance and replica, and every message in flight, is lost;
        the run restarts from ``manifest`` (None: the beginning). ``why``: under recovery="local",
        why it fell back to that (in ``fallback_reasons``)."""
        if self.local is not None:
            self.fallbacks += 1
            self.fallback_reasons.append(why)
        hosts = self.live.hosts
        target = self.restore.rollback(why or "a crash")  # what restore.restart() gave the caller
        self.stop_every_instance()
        if self.votes is not None:
            self.votes.restarted(*target)
        if self.resets_in_place:  # else the crash loses the writes (the process died before they landed)
            self.landed += self.incarnation.land_writes(hosts)
        self._start_incarnation(manifest, recovering=True)

    # -- scheduling ---------------------------------------------------------------------------

    def _choices(self) -> list:
        """What may happen next: the incarnation's moves, and the lifecycle's (restore an
        instance, the rescale's snapshot, begin or commit a snapshot), in a fixed order."""
        if self.restoring:
            return [self._restore_one]
        kinds = self.incarnation.deliveries(reading=self.rescaling.phase is None)
        rescale_snapshot = self.rescaling.due(kinds)
        if rescale_snapshot is not None:
            return [rescale_snapshot]
        kinds += self.incarnation.completions()
        if self.acker.collecting is not None and not self.acker.collecting.missing:
            kinds.append(self._commit)
        elif (self.store is not None and self.acker.collecting is None and self.acker.pushed != TOP and self.clock_value >= self.next_snapshot_at
              and self.rescaling.phase is None and (self.replicas is None or not self.replicas.replacements.catching_up)):
            if self.local is None or not self.local.busy(self.acker):
                kinds.append(self._begin_snapshot)
            elif self.acker.frontiers is not None:
                self.acker.frontiers.converge()  # a snapshot is due: the frontiers stop, the one watermark catches up
        return kinds

    def step(self) -> bool:
        """Take one scheduling decision; False when nothing is left to do."""
        if self.replicas is not None and self.replicas.replacements.catching_up:
            self.replicas.replacements.catch_up()  # the acker tells a replacement its frontier
        kinds = self._choices()
        if not kinds and (self.votes is None or self.votes.due is None):  # a vote's action may be left at the end
            return False
        self.steps_taken += 1
        self.clock_value += 0.001
        if self.crashes.maybe("during restore" if self.restoring and self.recovering else "any step", CRASH_ANY):
            return True
        if self.replica_faults is not None and self.replica_faults.step():
            return True
        if self.rescaling.maybe_begin():
            return True
        choice: Callable[[], None] = self.rng.choice(kinds)
        try:
            choice()
        except SilentCorruption as exc:  # verify="reexecute:N": caught; the run rolls back (see simulated_corruptions.py)
            self.corruptions.caught(exc.record)
        return True

    def roll_back(self, why: Any) -> None:
        """verify="majority" (see simulated_votes.py): every instance restarts from the newest snapshot every instance's vote certified
        (a mismatch, or a corrupt primary: its optimistic output may be settled downstream)."""
        epoch, sid = self.restore.rollback(f"a vote: {getattr(why, 'kind', why)}")
        manifest = self.restore.manifest(sid)
        self.stop_every_instance()
        self.votes.rolled_back(epoch, sid, why)
        self._start_incarnation(manifest, recovering=True)

    def stop_every_instance(self, plan: Optional[Plan] = None) -> None:
        """A rollback (a crash's, a vote's, a corruption caught) or a rescale to ``plan``, before
        every instance restarts: the snapshot being collected is given up (and a rescale under
        way, to begin again later), every incarnation and replica stops."""
        collecting = self.acker.collecting
        if collecting is not None:
            self.acker.end_snapshot(collecting.snapshot_id)
        self.rescaling.given_up()
        if self.local is not None:
            self.local.restart_all(plan)
        if self.replicas is not None:
            self.replicas.restart(plan)
        self.live.stop()

    def _begin_snapshot(self) -> None:
        """The supervisor's side: a new snapshot, its marker sent by the acker (see AckerHost.begin_snapshot)."""
        sid = self.next_snapshot_id
        self.next_snapshot_id += 1
        self.next_snapshot_at = self.clock_value + self.config.snapshot_interval
        collector = self.acker.begin_snapshot(sid)
        if self.votes is not None:  # an epoch ends at its time
            self.votes.boundary(collector.t)

    def _commit(self) -> None:
        """The supervisor's side: every part is in; the manifest is committed."""
        c = self.acker.end_snapshot(self.acker.collecting.snapshot_id)
        if self.crashes.maybe("between prepared and commit"):
            return
        manifest = manifest_of(self.plan, c.snapshot_id, committed_t(c.t, self.manifest), c.parts, c.missing, self.manifest)
        self.store.write_manifest(c.snapshot_id, manifest.to_json())
        self.commits += 1
        if self.plan.logged_steps:  # what the oldest restorable snapshot no longer replays (with votes: nor the certified one)
            trim_logs(self.store, None if self.votes is None else self.votes.certified_t(set(self.store.committed_ids())))
        if self.local is not None:  # a restore starts there now (a replacement replica's: at the snapshot the votes certified)
            self.local.trim(tuple(manifest.t) if self.votes is None else min(tuple(manifest.t), self.votes.certified_t()))
        if self.replicas is not None:
            self.replicas.trim(tuple(manifest.t))
        if self.votes is not None:
            self.votes.commit(c.t, c.snapshot_id)
        if self.crashes.maybe("after a commit"):
            return
        self.rescaling.committed(manifest)

    def run(self) -> RunResult:
        try:
            while self.step():
                pass
            if self.acker.pushed != TOP:
                raise RuntimeError(f"simulation stalled at watermark {self.acker.pushed} with {self.acker.table.in_flight()} times in flight")
            result = self.live.result(self.plan, self.clock_value)
            if self.local is None and self.manifest is not None and self.manifest.counts is not None:
                # What the incarnations before this one settled below the T it restored, as on Ray
                # (LiveStatus.carried): this one counts only what it settles from there.
                result.metrics.carry(self.manifest.counts)
            result.metrics.snapshots = self.commits
            result.metrics.recoveries = len(self.crash_points) + (0 if self.replica_faults is None else self.replica_faults.fallbacks)
            result.metrics.restores = {f"{i.stage}/{i.index}": n for i, n in sorted(self.restores.items())}
            result.metrics.skipped = self.skipped
            if self.votes is not None:
                result.metrics.dissents = self.votes.report()
            if self.corruptions is not None:
                result.metrics.corruptions = self.corruptions.report()
                result.metrics.recoveries += len(self.corruptions.restored)
            return result
        finally:
            self.close()

    def close(self) -> None:
        if self.replicas is not None:
            self.replicas.close()
        self.live.close()


def _refuse_impossible(plan: Plan, config: RunConfig, crashes: int, rescales: Sequence[int], replica_crashes: int = 0) -> None:
    """A FlowError now, not mid-run, for crashes, rescales or replicas a run cannot have."""
    if crashes and not config.takes_snapshots:
        raise FlowError("crashes need a guarantee: a run with guarantee='none' takes no snapshots to recover from")
    if rescales and not config.takes_snapshots:
        raise FlowError("rescales need a guarantee: a rescale restores from a snapshot")
    rescaled = [plan.with_parallelism(n) for n in rescales]
    if replica_crashes and config.replica_count == 1:
        raise FlowError("replica_crashes need replicas > 1: with one copy of each instance a crash is a recovery (crashes=)")
    if config.replica_count > 1:
        for target in rescaled:  # what Ray refuses too
            config.refuse_rescale(target)


def _fresh_store(config: RunConfig, scratch: str, pinned: Optional[Callable[[int], bool]] = None) -> tuple:
    """The run's snapshot directory and store (both None without a guarantee), emptied: a run
    starts afresh, as on Ray without resume. ``pinned``: the store keeps the newest snapshot it
    holds for (with votes: the newest certified, see :meth:`.simulated_votes.SimulatedVotes.pinned`)."""
    if not config.takes_snapshots:
        return None, None
    snapshot_dir = config.snapshot_dir or os.path.join(scratch, "store")
    store = SnapshotStore(snapshot_dir, pinned=pinned)
    for sid in store.snapshot_ids():
        store.delete_snapshot(sid)
    discard_outputs(store)
    return snapshot_dir, store


def run_simulated(plan: Plan, config: Optional[RunConfig] = None, crashes: int = 0, rescales: Sequence[int] = ()) -> RunResult:
    """Run ``plan`` in this process under the seeded scheduler (see module doc), with
    ``crashes`` seeded crashes and ``rescales`` to other parallelisms (they need a guarantee).

    It honours ``seed``, ``batch_size``, ``max_inflight``, ``guarantee``,
    ``snapshot_interval`` (in simulated seconds) and ``snapshot_dir`` (default: a
    temporary directory, removed after the run); any other option is refused rather
    than silently left out."""
    config = config or RunConfig()
    refused = config.not_defaults("seed", "batch_size", "max_inflight", "guarantee", "snapshot_interval", "snapshot_dir", "state_cache_bytes",
                                  "source_alignment", "input_merge", "fuse", "recovery", "replicas", "verify")
    if refused:
        raise FlowError(f"the simulator cannot honour {', '.join(refused)}: it runs one process without Ray; run with runtime='ray' for those")
    started = time.time()
    result = Simulation(plan, config, crashes, rescales).run()
    result.metrics.wall_time = time.time() - started
    return result
