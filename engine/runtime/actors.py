"""The Ray actors of a run: one async actor per stage instance, one acker actor.

Each is a thin shell over a pure object: :class:`StageActor` hosts a
:class:`~driftstream.engine.runtime.stage.StageRuntime`, wired to its snapshots
(:mod:`.stage_snapshots`), the queue of its incoming batches (:mod:`.batch_drain`), its
source's reading task (:mod:`.source_pump`) and its sinks' writer threads
(:mod:`.sink_writers`); :class:`AckerActor` hosts
:class:`~driftstream.ordering.acker.Acker`. Ray places, starts and kills them
(the supervisor decides when); batches, acks and watermarks travel on the data
plane (:mod:`.transport`, TCP between the actors). Every stage actor flushes its
XOR acks to the acker; the acker pushes watermarks to every stage actor.
"""

from __future__ import annotations

import asyncio
import random
import resource
import sys
import time
from typing import Any, Optional

import ray

from driftstream.ordering.channel_tables import ChannelAcker
from driftstream.ordering.meta import BOTTOM, TOP

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.model.errors import DataPlaneError
from driftstream.engine.model.live_figures import instance_stats
from driftstream.engine.model.manifest import Instance
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import InstanceReport
from driftstream.engine.runtime import gc_policy
from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.protocol import Push, ScheduleEnded, SnapshotTaken, Watermark
from driftstream.engine.runtime.ray_session import node_ip
from driftstream.engine.runtime.batch_drain import BatchDrain, hold_for_budget, writer_turn
from driftstream.engine.runtime.corruption_actors import CorruptionStageSide
from driftstream.engine.runtime.instance_host import ACKER, InstanceHost
from driftstream.engine.runtime.local_recovery_actors import LocalAckerSide, LocalStageSide
from driftstream.engine.runtime.lost_peers import RETIRED, LostPeers
from driftstream.engine.runtime.output_logs import LogWriter
from driftstream.engine.runtime.replica_actors import ReplicaAckerSide, ReplicaStageSide
from driftstream.engine.runtime.replica_draws import InstanceDraws
from driftstream.engine.runtime.replica_replacement_actors import ReplacementAckerSide, ReplacementStageSide
from driftstream.engine.runtime.replica_voter import EpochVoter
from driftstream.engine.runtime.replicas import DeferredPartition, KeptBundles
from driftstream.engine.runtime.sink_writers import SinkWriters
from driftstream.engine.runtime.source_pump import SourcePump
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.runtime.transport import Endpoint, FrameTooLarge
from driftstream.engine.runtime.verifier_link import VerifierLink


#: The interpreter's thread switch interval in stage actors (see StageActor.__init__).
SWITCH_INTERVAL_S = 0.001

#: Seconds between ``gc.freeze()`` calls in stage actors (see :func:`.gc_policy.freeze_survivors`).
FREEZE_EVERY_S = 1.0

#: Modules a flow's setup imports on its first use of a connector (Kafka's: ~0.06 s of CPU a
#: process, its client library and codecs). A warm actor, which has no flow yet, loads them
#: while it waits, as names: a preload, not a dependency of this module.
PRELOADED = ("driftstream.engine.connectors.kafka.source", "driftstream.engine.connectors.kafka.sink",
             "driftstream.engine.connectors.kafka.dead_letter_sink")


def preload_connectors() -> None:
    """Import :data:`PRELOADED` (what cannot be imported is left to the flow that needs it)."""
    import importlib

    for module in PRELOADED:
        try:
            importlib.import_module(module)
        except ImportError:
            pass


@ray.remote(num_cpus=0)
class AckerActor(ReplacementAckerSide, ReplicaAckerSide, LocalAckerSide):
    """Wraps :class:`~driftstream.ordering.acker.Acker`: folds the stage actors' flushes,
    pushes watermarks (coalesced) and tells the driver when the run ends or fails.

    Flushes arrive on one TCP connection per stage actor, so each sender's flushes
    are folded in the order it sent them: a bound never overtakes its XORs.
    """

    def __init__(self, sources: Optional[int], key: Optional[PlaneKey], local: bool = False, votes: bool = False,
                 sample: Optional[int] = None) -> None:
        # Counts resets and ends of snapshot schedules: a schedule from before one stops (see snapshots).
        self.generation = 0
        self.schedule_changed = asyncio.Event()
        # The supervisor's snapshot inbox (a connection that outlives resets), once a schedule started.
        self.inbox: Optional[Endpoint] = None
        self.inbox_address: Optional[tuple] = None
        self.endpoint: Optional[Endpoint] = None
        if sources is not None:  # else a warm actor (control/warm_actors.py): a flow's launch resets it
            self._setup(sources, key, ray.get_runtime_context().get_actor_name() or "acker", local, votes, sample)

    async def reset(self, sources: int, key: PlaneKey, name: Optional[str] = None, local: bool = False, votes: bool = False,
                    sample: Optional[int] = None) -> None:
        """Start over with an empty table (recovery of a surviving acker; a warm actor's first
        flow, whose acker it becomes under ``name``); ``local``: ``recovery="local"``'s tables;
        ``votes``: ``verify="majority"``'s tally (replicas > 1), ``sample``: N of ``"sample:N"``."""
        if self.endpoint is not None:
            await self.endpoint.close()
        self._setup(sources, key, name or self.me, local, votes, sample)

    def _setup(self, sources: int, key: PlaneKey, me: str, local: bool = False, votes: bool = False,
               sample: Optional[int] = None) -> None:
        self._end_schedule()
        self.verdicts_first = False  # see judge_before_end
        self.lost = LostPeers()
        self.me = me
        handler = self._on_message if not local else self._on_local_message if not votes else self._on_voted_message
        self.endpoint = Endpoint(key, handler, me=me, on_lost=self.lost.add, on_error=self._on_plane_error)
        #: verify="majority": the replicas' votes (set at connect, from the replicas) and the dissents so far
        self.voting, self.votes, self.dissents, self.gate_told, self.sample = votes, None, [], BOTTOM, sample
        #: recovery="local": replacement -> the frontier it was told while it catches up, and its incarnation
        self.catching_up: dict = {}
        self.incarnations: dict = {}
        #: replicas > 1: replicated instance -> its live replicas' incarnations, the primary first
        self.replica_sets: dict = {}
        self.collecting: Optional[asyncio.Event] = None
        self.source_keys: list = []
        #: replicas > 1: each replacement replica catching up, and when each joined (replica_replacement_actors.py)
        self.joining: dict = {}
        self.joined_at: dict = {}
        #: the acker's protocol (its table, watermarks, frontiers, snapshot parts); this actor adds the transport
        self.host = AckerHost(sources, self.endpoint.send if not local else self._told, defer=lambda fn: asyncio.get_running_loop().call_soon(fn),
                              finish=self._last_watermark, table=ChannelAcker(sources) if local else None)
        self.subscribers: dict = {}
        self.error: Optional[BaseException] = None
        self.done: Optional[asyncio.Event] = None

    async def playing(self) -> Optional[str]:
        """The name of the acker this actor plays (None: a warm acker with no flow)."""
        return None if self.endpoint is None else self.me

    async def seed(self, xors: list) -> None:
        """Before any source starts: the stage actors' XORs of :meth:`StageActor.take_seed`."""
        for x in xors:
            self.host.seed(x)

    async def listen(self) -> tuple:
        self.done = asyncio.Event()
        return await self.endpoint.listen(node_ip())

    async def connect(self, subscribers: dict, addresses: dict, aligned_sources: Optional[list] = None, source_keys: Optional[list] = None,
                      replicas: Optional[dict] = None) -> None:
        """``subscribers``: every stage actor by key, with its data-plane address;
        ``aligned_sources``: ``(key, group)`` of the source instances, by index, when they
        are told their source's frontier (aligned sources; ``group``: see
        :attr:`~driftstream.engine.model.plan.Plan.source_groups`); ``source_keys``: the source
        instances in order (``recovery="local"``: a failed one's bound is reset); ``replicas``
        (replicas > 1): replicated instance -> ``[(incarnation, address)]`` of its replicas, the
        primary (a subscriber) first."""
        self.subscribers = subscribers
        self.host.subscribers, self.host.aligned = list(subscribers), aligned_sources
        self.source_keys = [Instance(*k) for k in source_keys or ()]
        for key in subscribers:
            await self.endpoint.connect(key, addresses[key])
        if replicas:
            await self._connect_replicas(replicas)

    def _on_message(self, message: Any) -> None:
        self.host.receive(message)

    def _told(self, to: Any, message: Any) -> None:
        """The acker's message to ``to``, unless it is a watermark and ``to`` a replacement
        catching up (it is told the raw frontier instead, see :meth:`_on_local_message`); to
        each of its replicas too (replicas > 1: a marker to the primary only)."""
        if not (type(message) is Watermark and to in self.catching_up):
            self.endpoint.send(to, message)
            if self.replica_sets:
                self._tell_replicas(to, message)

    def _last_watermark(self, w: tuple) -> None:
        """The last watermark goes by Ray call so that the driver can wait for every stage to
        have released its output before it collects results."""
        if self.verdicts_first:
            asyncio.get_running_loop().create_task(self._after_verdicts(w))
            return
        self._release_last(w)

    async def judge_before_end(self) -> None:
        """verify="reexecute:N" on the verifier: the last watermark waits until every instance
        has the verdicts of what it shipped (a difference found after it would come too late:
        the sinks would have released what derives from it)."""
        self.verdicts_first = True

    async def _after_verdicts(self, w: tuple) -> None:
        try:
            await asyncio.gather(*(h.drained.remote() for h in self.subscribers.values()))
        except ray.exceptions.RayActorError:
            return  # an instance exited (a difference found): the supervisor recovers the run
        self._release_last(w)

    def _release_last(self, w: tuple) -> None:
        refs = [h.watermark.remote(w) for h in self.subscribers.values()]
        if self.votes is not None:  # verify="majority": the last epoch ends; the other replicas vote on it too
            self._last_epoch(w)
        asyncio.get_running_loop().create_task(self._finish(refs))

    async def _finish(self, refs: list) -> None:
        try:
            await asyncio.gather(*refs)
        except Exception as exc:  # a stage failed while releasing its last output
            self.error = self.error or exc
        self.done.set()

    async def snapshots(self, first_id: int, count: Optional[int], interval: float, timeout: float, inbox: tuple) -> None:
        """Take snapshots ``first_id``, ``first_id + 1``, ... ``interval`` seconds apart, ``count``
        of them (None: until the run completes), and send each to the supervisor's inbox
        as soon as every part is durable: ``(id, T, parts, missing, started, took_s)`` (see
        :meth:`_snapshot`); ``started`` and ``took_s`` (marker sent -> every part durable)
        time it. Ends early when the run completes, an actor does not answer (that
        snapshot is sent with its ``missing``), or :meth:`end_snapshots` or a reset ends
        the schedule; then sends the end and returns.

        ``inbox`` is ``(address, plane key, stream number)`` of a
        :class:`~driftstream.engine.control.snapshot_stream.SnapshotInbox`: one Ray call for the
        whole schedule, and each snapshot a data-plane message (a Ray streaming item cost
        ~1 ms of CPU on each side, see :mod:`.snapshot_stream`).
        """
        address, key, number = inbox
        if self.inbox is None or self.inbox_address != (address, key):
            if self.inbox is not None:
                await self.inbox.close()
            self.inbox, self.inbox_address = Endpoint(key, None), (address, key)
            await self.inbox.connect("supervisor", address)
        send, generation = self.inbox.send, self.generation
        snapshot_id = first_id
        try:
            while True:
                started = time.time()
                t, parts, missing = await self._snapshot(snapshot_id, timeout, interval)
                if t == TOP:
                    return
                send("supervisor", SnapshotTaken(number, (snapshot_id, t, parts, missing, started, time.time() - started)))
                snapshot_id += 1
                if missing or snapshot_id - first_id == count or self.generation != generation:
                    return
                try:  # an interval, cut short by end_snapshots
                    await asyncio.wait_for(self.schedule_changed.wait(), interval)
                except asyncio.TimeoutError:
                    pass
                if self.generation != generation:
                    return  # ended, or reset since (a recovery): these ids belong to the abandoned schedule
        finally:
            send("supervisor", ScheduleEnded(number))

    async def end_snapshots(self) -> None:
        """End the running :meth:`snapshots` schedule once the snapshot it is taking (if any) is sent."""
        self._end_schedule()

    def _end_schedule(self) -> None:
        self.generation += 1
        self.schedule_changed.set()  # wakes a schedule waiting out its interval
        self.schedule_changed = asyncio.Event()

    async def _snapshot(self, snapshot_id: int, timeout: float, interval: float = 0.0) -> tuple:
        """Take snapshot ``snapshot_id`` at the current watermark T: returns ``(T, parts, missing)``.

        Each stage actor gets the marker after every earlier watermark (one FIFO
        connection from the acker), so it has not pruned past T when it snapshots;
        its part (``prepared``) comes back on its data-plane connection once durable.
        ``parts`` maps actor keys to parts, ``missing`` lists the keys that did not
        answer within ``timeout`` seconds (hung). T is TOP, with no parts, when the
        run is complete.
        """
        waited = time.time()
        while self.catching_up or self.host.frontiers is not None:  # recovery="local": its marker would carry the watermark past the replacement
            if self.host.frontiers is not None and time.time() - waited >= interval:
                self.host.frontiers.converge()  # due an interval ago: the frontiers stop once the replacement caught up
            await asyncio.sleep(0.01)
        if self.host.table.watermark == TOP:
            return TOP, {}, []
        complete = self.collecting = asyncio.Event()
        collector = self.host.begin_snapshot(snapshot_id, lambda c: complete.set())
        if self.votes is not None:  # verify="majority" / "sample:N": the marker ends an epoch of the votes
            self._judge(self.votes.ended(snapshot_id, collector.t))
        try:
            await asyncio.wait_for(complete.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self.host.end_snapshot(snapshot_id)
        return collector.t, collector.parts, collector.missing

    async def alive(self) -> list:
        """The supervisor holds this call to learn at once when the actor dies (the call fails)
        or when it saw peers die: it returns their names (:class:`LostPeers`)."""
        return await self.lost.wait()

    async def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    async def ping(self) -> bool:
        """The heartbeat: answered only while the event loop is not stuck."""
        return True

    async def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.done.set()

    def _on_plane_error(self, peer: str, exc: BaseException) -> None:
        """A message this acker could not load or handle: the run fails with it."""
        if self.error is None:
            self.error = DataPlaneError(peer, "the acker", f"{type(exc).__name__}: {exc}")
        self.done.set()

    async def wait(self) -> Optional[BaseException]:
        await self.done.wait()
        return self.error

    async def status(self) -> dict:
        figures = self.host.status()
        if isinstance(self.host.table, ChannelAcker):  # recovery="local": a replacement catching up, what holds its frontier
            figures["catching_up"] = {Instance(*k).label: told for k, told in self.catching_up.items()}
            figures["holds"] = {str(token): t for token, t in self.host.table.holds.items()}
            figures["frontier_raw"] = self.host.table.frontier_raw()
            if self.host.frontiers is not None:
                figures["frontiers"] = {Instance(*k).label: told for k, told in self.host.frontiers.told.items()}
            if self.replica_sets:
                figures["replicas"] = {Instance(*k).label: list(incs) for k, incs in self.replica_sets.items()}
            if self.voting:
                figures["dissents"] = list(self.dissents)
        return figures

    async def close(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.close()
        if self.inbox is not None:
            await self.inbox.close()

    async def retire(self) -> None:
        """End this acker's flow and wait, with none, for the next one's :meth:`reset` (a warm
        actor handed back when its flow ended, see :mod:`~driftstream.engine.control.warm_actors`)."""
        self._end_schedule()
        await self.close()
        self.endpoint = self.inbox = self.inbox_address = None
        if getattr(self, "done", None) is not None:  # it ran a flow (a warm acker may come back unused)
            self.lost.add(RETIRED)  # answers the old supervisor's held alive() call: no task is left waiting
            self.done.set()


@ray.remote(num_cpus=0)
class StageActor(ReplacementStageSide, ReplicaStageSide, LocalStageSide, CorruptionStageSide):
    """One stage instance around a pure :class:`StageRuntime`.

    Created with ``config=None`` it is a *standby*: a started process, the flow's code
    loaded, that becomes an instance when a recovery resets it with that instance's key
    (starting a process costs about a second of CPU on a small machine, a reset milliseconds).
    """

    def __init__(self, plan: Plan, stage_index: Optional[int], instance: Optional[int], config: Optional[InstanceConfig],
                 plane: Optional[PlaneKey]) -> None:
        self.key = None if config is None else Instance(stage_index, instance)
        self.plan = plan
        # The event loop shares the interpreter lock with the sink writer, a remote snapshot
        # store's uploads and the Kafka fetcher's threads; when one of them holds it, the loop waits up
        # to a switch interval (5 ms by default) per hand-off. At 1 ms, exactly-once at
        # 50 ms snapshots measured ~2 ms closer to none at p50 (inverted index, 50 docs/s).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.pump: Optional[SourcePump] = None
        self.gc_task: Optional[asyncio.Task] = None
        # A setup error (a damaged snapshot file, a source that cannot be opened) is reported by
        # listen(), the launch's first call, as itself: raised here it would reach the
        # coordinator only as the text of a dead actor's error, taken for a death and retried.
        self.setup_error: Optional[Exception] = None
        if self.key is not None:
            try:
                self._setup(config, plane)
            except Exception as exc:
                self.setup_error = exc
        elif plan is None:
            preload_connectors()  # a warm actor (control/warm_actors.py): its flow's setup will not pay them

    async def reset(self, config: InstanceConfig, plane: PlaneKey, key: Optional[tuple] = None, plan: Optional[Plan] = None) -> dict:
        """Start over in this process from a snapshot (recovery of a survivor: no new process),
        as instance ``key`` when given (a standby taking a lost instance's place), of ``plan``
        when given (a rescale: the same flow at another parallelism). Returns
        where the time went: seconds of ``tear_down``, ``setup``, and ``restore`` within it.

        The old data-plane endpoint is closed first, so nothing sent before the
        reset can reach the new state.
        """
        t0 = time.perf_counter()
        fresh = self.key is None  # a standby or warm actor: no incarnation of its own yet
        if not fresh:
            await self._tear_down()
        t1 = time.perf_counter()
        if key is not None:
            self.key = Instance(*key)
        if plan is not None:
            self.plan = plan
        self.setup_error = None
        try:
            self._setup(config, plane)
        except Exception as exc:
            if not fresh:
                raise
            self.setup_error = exc  # as a new actor's (see __init__): listen() reports it as itself
            return {"tear_down": 0.0, "setup": time.perf_counter() - t1, "restore": 0.0}
        return {"tear_down": t1 - t0, "setup": time.perf_counter() - t1, "restore": self.host.snapshots.restore_s}

    async def playing(self) -> Optional[str]:
        """The name of the instance this actor plays (None: a standby not used yet)."""
        return None if self.key is None else self.plan.actor_name(self.key)

    async def retire(self) -> None:
        """End the instance this actor plays and wait, with no flow, for the next one's
        :meth:`reset` (a warm actor handed back when its flow ended, see
        :mod:`~driftstream.engine.control.warm_actors`): its sinks, backends, reader and
        connections closed, its working directory removed."""
        if self.key is not None:
            await self._tear_down()
            self.lost.add(RETIRED)  # answers the old supervisor's held alive() call: no task is left waiting
        self.key = self.plan = self.acker = self.pump = None
        self.setup_error = None

    async def _tear_down(self) -> None:
        self.drain.close()
        if self.pump is not None:
            self.pump.stop()
        await self.endpoint.close()
        self.writers.close()
        self.host.close()

    def _write_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        host = self.host
        if host.verifier is not None:  # verify="reexecute:N" on the verifier: after the verdicts at or below its time
            host.verifier.hold(None if bundle.t_last is None else tuple(bundle.t_last[:4]), lambda: self._write_now(host, sid, sink, bundle))
            return
        self._write_now(host, sid, sink, bundle)

    def _write_now(self, host: InstanceHost, sid: int, sink: Any, bundle: Any) -> None:
        if host is self.host:
            self.writers.write(sid, sink, bundle, lambda error: self._bundle_written(host, sid, bundle, error))

    def _bundle_written(self, host: InstanceHost, sid: int, bundle: Any, error: Optional[BaseException]) -> None:
        if host is not self.host:
            return  # written for an incarnation that was reset since
        if host.bundle_written(sid, bundle, error) and self.first_release_at is None:
            self.first_release_at = time.time()
            self.released.set()
        if not host.rt.sinks.writing or host.failed:
            self.writers.idle.set()

    def _setup(self, config: InstanceConfig, plane: PlaneKey) -> None:
        plan = self.plan
        self.acker = None
        self.chaos = config.chaos
        self.rng = random.Random(config.seed)
        snapshots = StageSnapshots(config.snapshot_dir, plan.participant(self.key), config.restore, cache_bytes=config.state_cache_bytes)
        #: the instance's protocol (its runtime, snapshots, reader); this actor adds the transport and the event loop
        # recovery="local": the instances' incarnations (this actor's own copy, kept current by peer_failed)
        local = {} if config.incarnations is None else {"incarnations": {Instance(*k): n for k, n in config.incarnations.items()}}
        send, writer, me = self._send, self._write_bundle, self.plan.actor_name(self.key)
        #: replicas > 1: replicated instance -> its live replicas' incarnations, the primary first (None: the default path)
        self.replica_sets = None if config.replica_sets is None else {Instance(*k): list(v) for k, v in config.replica_sets.items()}
        #: a replica that is not the primary: what its sinks released since the last commit (None: it writes them)
        self.kept: Optional[KeptBundles] = None
        voting = config.votes and self.replica_sets is not None and self.key in self.replica_sets
        if self.replica_sets is not None:
            send = self._send_to_replicas if not voting else self._send_voted
        if config.replica is not None:
            local["incarnation"], me = config.replica
            self.kept, writer = KeptBundles(), self._keep_bundle
            local["sink_opener"] = lambda sid, index: DeferredPartition(plan.steps[sid].sink, index, plan.parallelism)
        if voting:
            writer = self._voted_bundle if config.sample is None else self._sampled_bundle
        self.send = send
        # verify="reexecute:N" with reexecute_on="verifier": the re-runs go to the flow's verifier actor
        link = None if config.verifier is None or config.reexecute is None else VerifierLink.on_ray(config.verifier)
        self.host = host = InstanceHost(plan, self.key, config, snapshots, send, fail=self._fail, sample_every=config.sample_every,
                                        bundle_writer=writer, corrupted=self._corrupted, verifier=link, **local)
        #: verify="majority", a replica: its digests and, the primary's, its gate (None: the default path)
        self.voter = None if not voting else EpochVoter(host, host.recovery.own, config.replica is None, lambda m: self._send(ACKER, m),
                                                        self._gate_write, config.sample)
        if host.output_logs is not None and self.replica_sets is not None and self.key in self.replica_sets:
            # replicas > 1, steps declared deterministic=False: the primary draws, the others take its draws
            host.draws = InstanceDraws(host.rt, config.replica is None, host.recovery.own, self._send, self._draw_followers,
                                       lambda: self.replica_sets[self.key][0])
        if host.recovery is not None and config.replica is not None:
            # a replica's that is not the primary: its output is all dropped (logged); a replacement's cut comes with connect()
            host.recovery.cut = TOP
        self.batch_size = config.batch_size
        self.rt = host.rt
        if host.output_logs is not None:  # steps declared deterministic=False: acks wait for their log's writes
            LogWriter(host.output_logs, host.fail)
        self.writers = SinkWriters(host.rt.barriers)
        self.pump = None if host.reader is None else SourcePump(
            host.reader, host.source_index, config.batch_size, process=lambda items: host.guarded(host.rt.process_source, items),
            flush=host.flush_read, fail=host.fail, alive=lambda: not host.failed,
            took=lambda seconds: writer_turn(snapshots, seconds), held=lambda: hold_for_budget(snapshots), work=host.rt.work,
            # a stage that sends to others lingers in a backlog (fewer, larger batches); a fused flow's sends nothing
            pending=host.rt.outbound.pending if plan.receivers_of(host.rt.stage.index) else None)
        if self.pump is not None:
            host.source = self.pump  # a watermark or a frontier also wakes the reading task
        took = None if host.recovery is None else lambda batches: [host.recovery.received(b) for b in batches]
        self.drain = BatchDrain(host.rt, snapshots, host.guarded, host.flush, took)
        self.lost = LostPeers()
        self.endpoint = Endpoint(plane, self._on_message if self.voter is None else self._on_voted_message, me=me, on_lost=self.lost.add,
                                 on_error=self._on_plane_error)
        self.first_release_at: Optional[float] = None
        self.released: Optional[asyncio.Event] = None

    @property
    def reader(self) -> Optional[SourceReader]:
        """This instance's source reader (None: its stage has no source)."""
        return self.host.reader

    async def first_release(self) -> float:
        """Wall time of this actor's first release to a sink (waits for it): recovery timing."""
        await self.released.wait()
        return self.first_release_at

    async def listen(self) -> tuple:
        if self.setup_error is not None:
            raise self.setup_error
        if self.gc_task is None:  # once per process: listen() runs again after a reset
            self.gc_task = asyncio.get_running_loop().create_task(gc_policy.freeze_survivors(FREEZE_EVERY_S))
        self.released = asyncio.Event()
        return await self.endpoint.listen(node_ip())

    async def connect(self, acker, addresses: dict, replicas: Optional[dict] = None, cut: Optional[tuple] = None) -> None:
        """Open data-plane connections to the acker and to every instance of a downstream stage
        (``replicas``: incarnation -> ``(instance, address)`` of the replicas that are not the
        primary; replicas > 1). ``cut`` (recovery="local", a replacement): the watermark when
        its predecessor failed; its output below is dropped (the receivers have it)."""
        self.acker = acker
        if cut is not None:
            self.host.recovery.cut = cut
        await self.endpoint.connect("acker", addresses["acker"])
        downstream = self.plan.receivers_of(self.key[0])
        for key in addresses:
            if key != "acker" and key[0] in downstream:
                await self.endpoint.connect(key, addresses[key])
        if replicas:
            await self._connect_replicas(replicas, downstream)

    async def take_seed(self) -> dict:
        """Before :meth:`start`: the XORs of the timers of the windows this incarnation
        restored (:meth:`StageRuntime.take_seed`), for the acker's table."""
        seed = self.rt.take_seed()
        return seed if self.host.recovery is None or not seed else self.host.recovery.tag(seed)

    async def t_last(self) -> Optional[tuple]:
        """See :meth:`StageRuntime.t_last` (asked after a recovery)."""
        return self.rt.t_last()

    async def start(self, skip_after: Optional[tuple] = None) -> int:
        """Start reading. ``skip_after`` (at-most-once recovery): replay only up to that
        time, then skip to the live end; returns the number of records skipped."""
        return 0 if self.pump is None else self.pump.start(skip_after)

    async def pause_reading(self) -> Optional[tuple]:
        """Stop reading the source (a rescale's drain), once the reads in progress are sent with
        the bound that covers them; returns ``(source index, that bound)``: the acker has settled
        for the drain only once it holds it (the Ray call may overtake the data plane's message).
        None for a stage without a source."""
        if self.pump is None:
            return None
        if self.pump.task is not None:
            await self.pump.pause()
            if not self.host.failed:
                self.host.flush()
        return self.host.source_index, self.host.last_bound

    async def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading` (a drain given up on: the sinks held output past it)."""
        if self.pump is not None:
            self.pump.resume()

    def _on_message(self, message: Any) -> None:
        if type(message) is Push:
            self.drain.push(message.batch)  # processed a chunk per callback (see BatchDrain)
        else:
            self.host.on_message(message)

    async def alive(self) -> list:
        """The supervisor holds this call to learn at once when the actor dies (the call fails)
        or when it saw peers die: it returns their names (:class:`LostPeers`)."""
        return await self.lost.wait()

    async def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    async def watermark(self, w: tuple) -> None:
        """The last watermark: returns once the sinks acknowledged everything it released."""
        self.host.apply_watermark(w)
        if self.voter is not None:  # verify="majority": once the votes passed the last epoch and the gate let it through
            await self._voted_end(w)
        await self.writers.idle.wait()

    async def report(self) -> InstanceReport:
        """Stop, close sinks and backends, and hand back outputs and metrics (copies: Ray
        serialises the result outside the event loop)."""
        if self.pump is not None:
            self.pump.stop()
        if not self.host.failed:
            await self.writers.idle.wait()
        self.host.failed = True  # nothing more is processed in this incarnation
        self.writers.close()
        self.host.close()
        await self.endpoint.close()
        metrics = self.rt.metrics()
        metrics["state_cache"] = self.host.snapshots.cache_stats()
        metrics["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        if self.reader is not None:
            metrics["first_read_at"] = self.reader.first_read_at
        return InstanceReport(self.rt.collected(), metrics, dict(self.rt.emit_times), dict(self.rt.release_times))

    async def ping(self) -> bool:
        return True

    async def stats(self, releases_since: Optional[float] = None, emits_of: Optional[list] = None) -> dict:
        """Progress counters for ``FlowHandle.status()`` (see :func:`.live_figures.instance_stats`)."""
        stats = instance_stats(self.rt, self.reader, self.host.snapshots.cache_stats(), releases_since, emits_of)
        if self.host.verifier is not None:  # verify="reexecute:N" on the verifier: what it shipped, dropped, lost
            stats["reexecution"] = self.host.verifier.stats()
        return stats

    def _on_plane_error(self, peer: str, exc: BaseException) -> None:
        """A message this actor could not load or handle: the run fails with it."""
        if not self.host.failed:
            self.host.fail(DataPlaneError(peer, self.plan.actor_name(self.key), f"{type(exc).__name__}: {exc}"))

    def _fail(self, exc: BaseException) -> None:
        """The run fails with ``exc`` (see :meth:`InstanceHost.fail`): the acker tells the supervisor."""
        self.acker.fail.remote(exc)

    def _send(self, to: Any, message: Any) -> None:
        """The host's transport: the data plane, a batch delayed at random under ``chaos``."""
        if self.chaos and type(message) is Push:
            asyncio.get_running_loop().call_later(self.rng.uniform(0, self.chaos), self.endpoint.send, to, message)
            return
        try:
            self.endpoint.send(to, message)
        except FrameTooLarge as exc:
            self.host.fail(exc)  # the batch cannot be sent: the run fails and says why, it must not stall
