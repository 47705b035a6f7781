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
from collections import deque
from typing import Callable, Optional, Sequence

from driftstream.ordering.meta import TOP
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import RunConfig, aligned_sources
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import Manifest, committed_t, manifest_of
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.reassignment import reassigned
from driftstream.engine.model.recovery import RecoveryRules, drained, replay_limit
from driftstream.engine.model.result import RunResult
from driftstream.engine.runtime.simulated_acker import SimulatedAcker
from driftstream.engine.runtime.instance_host import ACKER
from driftstream.engine.runtime.protocol import Push, Watermark
from driftstream.engine.runtime.simulated_instances import SimulatedInstances

#: What the simulator's scheduler gets when the run does not say: small batches and credit,
#: so that there are many interleavings for it to choose from.
SIMULATOR_BATCH_SIZE, SIMULATOR_MAX_INFLIGHT = 8, 64

#: Where a seeded crash may strike: at any step, or right at a moment of the protocol
#: where a wrong rule would lose or duplicate output.
CRASH_POINTS = ("any step", "after a marker", "between prepared and commit", "after a commit", "during restore")

#: Chance of a crash at any step, and at a critical point (a marker: shared by every
#: instance's), while crashes remain; low enough that most crashes strike after a commit.
CRASH_ANY, CRASH_AT_POINT = 0.004, 0.15

#: Chance per step that a pending rescale begins (its sources stop reading).
RESCALE_AT = 0.03


class Simulation:
    """One seeded run. ``step()`` performs one scheduling decision; ``run()`` runs to the end.

    ``crashes``: how many seeded crashes strike the run (it needs a guarantee: a run
    without snapshots has nothing to recover from). ``crash_points`` lists where each struck.
    ``resets_in_place``: each crash is a reset of the live instances in place, as Ray resets
    survivors: the same :class:`~.instance_host.InstanceHost` teardown and setup, and the
    sink writes in progress land before the restart instead of being lost.
    ``acker_shards``: that many :class:`~.acker_shard.AckShardHost` fold the instances'
    messages to the acker (round robin), each flushing its batch when the scheduler says,
    and pass the acker's watermarks and markers on to their instances.
    """

    def __init__(self, plan: Plan, config: Optional[RunConfig] = None, crashes: int = 0, rescales: Sequence[int] = (),
                 resets_in_place: bool = False, acker_shards: int = 0) -> None:
        config = config or RunConfig()
        #: acker shards between the instances and the acker (0: none; see SimulatedAcker)
        self.shard_count = acker_shards
        #: crashes are resets in place (see _crash); ``landed``: the sink writes that finished in one
        self.resets_in_place, self.landed = resets_in_place, 0
        if crashes and not config.takes_snapshots:
            raise FlowError("crashes need a guarantee: a run with guarantee='none' takes no snapshots to recover from")
        if rescales and not config.takes_snapshots:
            raise FlowError("rescales need a guarantee: a rescale restores from a snapshot")
        for n in rescales:
            plan.with_parallelism(n)  # a FlowError now, not mid-run
        self.rescales = list(rescales)
        #: None; "draining" (sources stopped, waiting for what they read to settle); or
        #: "snapshot" (the rescale's snapshot is being taken)
        self.rescale_phase: Optional[str] = None
        self.rescaled: list = []  # per rescale done: (parallelism, the snapshot id it restored)
        self.plan = plan
        self.config = config
        self.rng = random.Random(config.seed)
        self.clock_value = 0.0
        self.steps_taken = 0
        self.crashes_left = crashes
        self.crash_points: list = []
        self.commits = 0
        self.skipped = 0
        self.recoveries: list = []  # per crash: the snapshot id its restart restored (None: the beginning)
        self.snapshot_dir: Optional[str] = None
        self.store: Optional[SnapshotStore] = None
        self.live = SimulatedInstances(clock=self._clock)
        if config.takes_snapshots:
            self.snapshot_dir = config.snapshot_dir or os.path.join(self.live.scratch, "store")
            self.store = SnapshotStore(self.snapshot_dir)
            for sid in self.store.snapshot_ids():  # a run starts afresh, as on Ray without resume
                self.store.delete_snapshot(sid)
        self.rules = RecoveryRules(config, self.snapshot_dir, {"batch_size": SIMULATOR_BATCH_SIZE, "max_inflight": SIMULATOR_MAX_INFLIGHT})
        # Every snapshot a base, or bases rarely (deltas in between): both restore paths get seeds.
        self.base_every_s = self.rng.choice([0.0, 3600.0])
        self.next_snapshot_id = 1
        self.next_snapshot_at = config.snapshot_interval
        self.source_keys = plan.source_instances
        self.aligned = aligned_sources(plan, config.source_alignment)  # (instance, group) told frontiers
        try:
            self._start_incarnation(manifest=None, recovering=False)
            while self.restoring:
                self._restore_one()
        except BaseException:
            self.close()  # e.g. a source that cannot open: nothing is left in the scratch directory
            raise

    @property
    def stages(self) -> dict:
        return self.live.stages

    @property
    def readers(self) -> dict:
        return self.live.readers

    # -- incarnations ---------------------------------------------------------------------

    def _start_incarnation(self, manifest: Optional[Manifest], recovering: bool) -> None:
        """Forget everything in flight; instances are then restored one per step."""
        self.manifest, self.recovering = manifest, recovering
        self.restoring = list(self.plan.instances)
        #: the acker and its shards (:mod:`.simulated_acker`); ``acker``: the root, what the steps read
        # late-bound: what replaces _send_control (a test's recorder) sees the acker's messages too
        self.ackers = SimulatedAcker(len(self.source_keys), lambda *message: self._send_control(*message), self.plan.instances, self.aligned, self.shard_count)
        self.acker = self.ackers.root
        self.data: list = []  # (stage, instance, Batch)
        self.control: dict = {}  # (sender, receiver) -> deque of messages
        self.writes: list = []  # (instance, sink step, sink partition, bundle): written when the scheduler says

    def _restore_one(self) -> None:
        """Start the next instance of the incarnation from the manifest (a scheduling step)."""
        instance = self.restoring.pop(0)
        ordinal = self.plan.instances.index(instance)
        config = self.rules.instance_config(instance, ordinal, self.manifest, self.recovering)
        host = self.live.start(self.plan, instance, config, self.rng.getrandbits(32), self.base_every_s,
                               lambda sid, sink, bundle: self.writes.append((instance, sid, sink, bundle)), self._sender(instance))
        seed = host.rt.take_seed()  # restored windows' timers, in the table before any source starts
        if seed:
            self.acker.seed(seed)
        if not self.restoring and self.recovering and self.rules.skips_backlog:
            limit = replay_limit(rt.t_last() for rt in self.stages.values())
            self.skipped += sum(r.skip_after(limit) for r in self.readers.values())

    def _crash(self, point: str) -> None:
        """Every instance and message in flight is lost; restart from the newest manifest."""
        self.crashes_left -= 1
        self.crash_points.append(point if self.rescale_phase is None else f"{point} (rescale {self.rescale_phase})")
        hosts = self.live.hosts
        self.live.stop()
        if self.resets_in_place:
            # As StageActor.reset: the sink write in progress finishes (SinkWriters.close waits for
            # it) before the new incarnation reads its sinks, and its callback finds the old
            # incarnation closed. A crash otherwise loses it (the process died before it landed).
            for instance, sid, sink, bundle in self.writes:
                sink.write(bundle)
                self.landed += 1
                hosts[instance].bundle_written(sid, bundle)
        self.rescale_phase = None  # a pending rescale begins again later
        data = self.store.read_latest_manifest()
        manifest = None if data is None else Manifest.from_json(data)
        self.recoveries.append(None if manifest is None else manifest.snapshot_id)
        self._start_incarnation(manifest, recovering=True)

    def _rescale(self, manifest: Manifest) -> None:
        """The rescale's snapshot is committed: restart at the next parallelism from it. The
        reassigned manifest is committed first, so a crash from here on restores at the new
        parallelism, whose routing wrote any output past the snapshot."""
        plan = self.plan.with_parallelism(self.rescales.pop(0))
        self.live.stop()
        self.plan, self.source_keys, self.rescale_phase = plan, plan.source_instances, None
        self.aligned = aligned_sources(plan, self.config.source_alignment)
        sid = self.next_snapshot_id
        self.next_snapshot_id += 1
        moved = reassigned(manifest, plan, sid)
        self.store.write_manifest(sid, moved.to_json())
        self.rescaled.append((plan.parallelism, manifest.snapshot_id))
        self._start_incarnation(moved, recovering=True)

    def _maybe_crash(self, point: str, chance: float = CRASH_AT_POINT) -> bool:
        if self.crashes_left and self.rng.random() < chance:
            self._crash(point)
            return True
        return False

    # -- messages -------------------------------------------------------------------------

    def _clock(self) -> float:
        return self.clock_value

    def _send_control(self, sender, receiver, message) -> None:
        self.control.setdefault((sender, receiver), deque()).append(message)

    def _sender(self, instance: Instance) -> Callable:
        """The transport of ``instance``'s host: a batch joins the data in flight (delivered in
        any order), a message to the acker its FIFO control queue."""
        def send(to, message) -> None:
            if type(message) is Push:
                self.data.append((*to, message.batch))
            else:
                self._send_control(instance, to, message)
        return send

    def _flush(self, instance: Instance) -> int:
        """Send what ``instance`` has to send (see :meth:`InstanceHost.flush`); returns the elements sent."""
        return self.live.hosts[instance].flush()

    def _to_stage(self, instance: Instance, message) -> None:
        self.live.hosts[instance].on_message(message)
        if type(message) is Watermark and message.snapshot_id is not None:
            self._maybe_crash("after a marker", CRASH_AT_POINT / len(self.plan.instances))

    # -- scheduling: each choice is one of the methods below ---------------------------------

    def _choices(self) -> list:
        if self.restoring:
            return [self._restore_one]
        kinds: list = []
        if self.data:
            kinds.append(self._deliver_data)
        if any(self.control.values()):
            kinds.append(self._deliver_control)
        if self.ackers.pending:
            kinds.append(self._flush_acker_shard)
        if self.rescale_phase is None and any(self.live.source_ready(k) for k in self.readers):
            kinds.append(self._read_source)
        if self.rescale_phase == "draining" and not kinds and not self.writes and self.acker.collecting is None:
            return [self._rescale_snapshot]  # nothing in flight: the watermark stays where it is
        if any(rt.holding for rt in self.stages.values()):
            kinds.append(self._release_held)
        if self.writes:
            kinds.append(self._write_bundle)
        if any(s.pending_writes() for s in self.live.snapshots.values()):
            kinds.append(self._persist)
        if self.acker.collecting is not None and not self.acker.collecting.missing:
            kinds.append(self._commit)
        elif (self.store is not None and self.acker.collecting is None and self.acker.pushed != TOP and self.clock_value >= self.next_snapshot_at
              and self.rescale_phase is None):
            kinds.append(self._begin_snapshot)
        return kinds

    def step(self) -> bool:
        """Take one scheduling decision; False when nothing is left to do."""
        kinds = self._choices()
        if not kinds:
            return False
        self.steps_taken += 1
        self.clock_value += 0.001
        if self._maybe_crash("during restore" if self.restoring and self.recovering else "any step", CRASH_ANY):
            return True
        if self.rescales and self.rescale_phase is None and not self.restoring and self.acker.pushed != TOP and self.rng.random() < RESCALE_AT:
            self.rescale_phase = "draining"
            # The sources stop reading, each once what it read is sent with its bound (Ray's
            # pause_reading): a bound sent later (a source with nothing left to read) would
            # move the watermark past the snapshot, and release output after it.
            for instance in self.readers:
                self._flush(instance)
            return True
        choice: Callable[[], None] = self.rng.choice(kinds)
        choice()
        return True

    def _deliver_data(self) -> None:
        i = self.rng.randrange(len(self.data))
        self.data[i], self.data[-1] = self.data[-1], self.data[i]
        stage, index, batch = self.data.pop()
        self.live.hosts[(stage, index)].receive([batch])

    def _deliver_control(self) -> None:
        sender, receiver = self.rng.choice([k for k, q in self.control.items() if q])
        message = self.control[(sender, receiver)].popleft()
        if receiver == ACKER:
            self.ackers.receive(sender, message)
        elif self.ackers.relays(receiver):  # the acker's watermark, for a shard to pass on
            self.ackers.relay(receiver, message)
        else:
            self._to_stage(receiver, message)
            if receiver in self.stages:  # else: a crash at the marker
                self._flush(receiver)

    def _flush_acker_shard(self) -> None:
        self.ackers.flush_one(self.rng)

    def _read_source(self) -> None:
        instance = self.rng.choice([k for k in self.readers if self.live.source_ready(k)])
        budget = self.rng.randint(1, self.rules.settings["batch_size"])
        items = self.readers[instance].poll(budget)
        if items:
            self.live.hosts[instance].guarded(self.stages[instance].process_source, items)
        # Senders never say more is coming here: a sender that did would hold the others for
        # MERGE_MAX_HOLD_S of simulated time (a thousand steps), and the scheduler's random
        # "release held" steps already give the merge every interleaving.
        sent = self._flush(instance)
        if items:
            self.readers[instance].made(len(items), sent)

    def _release_held(self) -> None:
        instance = self.rng.choice([k for k, rt in self.stages.items() if rt.holding])
        host = self.live.hosts[instance]
        host.guarded(host.rt.release_held, self.rng.random() < 0.5)
        self._flush(instance)

    def _write_bundle(self) -> None:
        instance, sid, sink, bundle = self.writes.pop(self.rng.randrange(len(self.writes)))
        sink.write(bundle)
        self.live.hosts[instance].bundle_written(sid, bundle)
        self._flush(instance)

    def _persist(self) -> None:
        instance = self.rng.choice([k for k, s in self.live.snapshots.items() if s.pending_writes()])
        self.live.snapshots[instance].write_next()
        self._flush(instance)

    def _rescale_snapshot(self) -> None:
        if self.acker.table.settled() and drained(self.acker.pushed, (rt.t_last() for rt in self.stages.values())):
            self.rescale_phase = "snapshot"
            self._begin_snapshot()
        else:  # the sinks hold output a recovery has not replayed yet (or it did not settle): go on, try again later
            self.rescale_phase = None

    def _begin_snapshot(self) -> None:
        """The supervisor's side: a new snapshot, its marker sent by the acker (see AckerHost.begin_snapshot)."""
        sid = self.next_snapshot_id
        self.next_snapshot_id += 1
        self.next_snapshot_at = self.clock_value + self.config.snapshot_interval
        self.acker.begin_snapshot(sid)

    def _commit(self) -> None:
        """The supervisor's side: every part is in; the manifest is committed."""
        c = self.acker.end_snapshot(self.acker.collecting.snapshot_id)
        if self._maybe_crash("between prepared and commit"):
            return
        manifest = manifest_of(self.plan, c.snapshot_id, committed_t(c.t, self.manifest), c.parts, c.missing, self.manifest)
        self.store.write_manifest(c.snapshot_id, manifest.to_json())
        self.commits += 1
        if self._maybe_crash("after a commit"):
            return
        if self.rescale_phase == "snapshot":
            self._rescale(manifest)

    def run(self) -> RunResult:
        try:
            while self.step():
                pass
            if self.acker.pushed != TOP:
                raise RuntimeError(f"simulation stalled at watermark {self.acker.pushed} with {self.acker.table.in_flight()} times in flight")
            result = self.live.result(self.plan, self.clock_value)
            result.metrics.snapshots = self.commits
            result.metrics.recoveries = len(self.crash_points)
            result.metrics.skipped = self.skipped
            return result
        finally:
            self.close()

    def close(self) -> None:
        self.live.close()


def run_simulated(plan: Plan, config: Optional[RunConfig] = None, crashes: int = 0, rescales: Sequence[int] = ()) -> RunResult:
    """Run ``plan`` in this process under the seeded scheduler (see module doc), with
    ``crashes`` seeded crashes and ``rescales`` to other parallelisms (they need a guarantee).

    It honours ``seed``, ``batch_size``, ``max_inflight``, ``guarantee``,
    ``snapshot_interval`` (in simulated seconds) and ``snapshot_dir`` (default: a
    temporary directory, removed after the run); any other option is refused rather
    than silently left out."""
    config = config or RunConfig()
    refused = config.not_defaults("seed", "batch_size", "max_inflight", "guarantee", "snapshot_interval", "snapshot_dir", "state_cache_bytes",
                                  "source_alignment", "input_merge", "fuse")
    if refused:
        raise FlowError(f"the simulator cannot honour {', '.join(refused)}: it runs one process without Ray; run with runtime='ray' for those")
    started = time.time()
    result = Simulation(plan, config, crashes, rescales).run()
    result.metrics.wall_time = time.time() - started
    return result
