"""The Ray actors of a run: one async actor per stage instance, one acker actor.

Each is a thin shell over a pure object: :class:`StageActor` hosts a
:class:`~driftstream.engine.runtime.stage.StageRuntime` (and its snapshots, its
source reader and its sinks' writer threads), :class:`AckerActor` hosts
:class:`~driftstream.ordering.acker.Acker`. Ray places, starts and kills them
(the supervisor decides when); batches, acks and watermarks travel on the data
plane (:mod:`.transport`, TCP between the actors). Every stage actor flushes its
XOR acks to the acker; the acker pushes watermarks to every stage actor.
"""

from __future__ import annotations

import asyncio
import gc
import random
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import ray

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import BOTTOM, TOP
from driftstream.snapshots.checksums import CorruptSnapshot

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.model.config import InstanceConfig, plan_alignment
from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.model.errors import DataPlaneError, StepError
from driftstream.engine.model.live_figures import emit_samples, recent_samples
from driftstream.engine.model.manifest import Instance, PartCollector, SnapshotPart
from driftstream.engine.model.plan import Plan
from driftstream.engine.runtime import gc_policy
from driftstream.engine.runtime.protocol import Ack, Align, Prepared, Push, ScheduleEnded, SnapshotTaken, Watermark
from driftstream.engine.runtime.ray_session import node_ip
from driftstream.engine.runtime.stage import StageRuntime
from driftstream.engine.runtime.stage_snapshots import SLICE_S, StageSnapshots
from driftstream.engine.runtime.transport import Endpoint


class LostPeers:
    """The peers whose data-plane connection ended while one incarnation of an actor ran:
    their processes died (alone or with their node). One per incarnation, so connections
    that a reset closes on purpose never count for the next one."""

    def __init__(self) -> None:
        self.names: set = set()
        self.event = asyncio.Event()

    def add(self, name: str) -> None:
        self.names.add(name)
        self.event.set()

    async def wait(self) -> list:
        await self.event.wait()
        await asyncio.sleep(0.05)  # the peers of one lost node go within milliseconds: one answer
        return sorted(self.names)

#: The interpreter's thread switch interval in stage actors (see StageActor.__init__).
SWITCH_INTERVAL_S = 0.001

#: Seconds between ``gc.freeze()`` calls in stage actors (see StageActor._freeze_survivors).
FREEZE_EVERY_S = 1.0

#: Elements of queued batches processed in one event-loop callback (see StageActor._drain).
DRAIN_CHUNK = 4096

#: The longest turn the snapshot writer gets when the loop is busy (see StageActor._drain).
MAX_WRITER_SLICE_S = 0.25

#: Seconds between looks at a state cache over its budget, waiting for a base (see StageActor._drain).
BUDGET_WAIT_S = 0.002


@ray.remote(num_cpus=0)
class AckerActor:
    """Wraps :class:`~driftstream.ordering.acker.Acker`: folds the stage actors' flushes,
    pushes watermarks (coalesced) and tells the driver when the run ends or fails.

    Flushes arrive on one TCP connection per stage actor, so each sender's flushes
    are folded in the order it sent them: a bound never overtakes its XORs.
    """

    def __init__(self, sources: int, key: PlaneKey) -> None:
        # Counts resets and ends of snapshot schedules: a schedule from before one stops (see snapshots).
        self.generation = 0
        self.schedule_changed = asyncio.Event()
        # The supervisor's snapshot inbox (a connection that outlives resets), once a schedule started.
        self.inbox: Optional[Endpoint] = None
        self.inbox_address: Optional[tuple] = None
        self._setup(sources, key)

    async def reset(self, sources: int, key: PlaneKey) -> None:
        """Start over with an empty table (recovery of a surviving acker)."""
        await self.endpoint.close()
        self._setup(sources, key)

    def _setup(self, sources: int, key: PlaneKey) -> None:
        self._end_schedule()
        self.acker = Acker(sources)
        self.lost = LostPeers()
        self.endpoint = Endpoint(key, self._on_message, me=ray.get_runtime_context().get_actor_name() or "acker", on_lost=self.lost.add,
                                 on_error=self._on_plane_error)
        self.subscribers: dict = {}
        self.pushed = self.acker.watermark
        self.push_scheduled = False
        #: aligned sources: (key, its source's acker indexes) per source instance, and the
        #: frontier last told each group
        self.aligned: Optional[list] = None
        self.frontier_told: dict = {}
        self.align_scheduled = False
        self.error: Optional[BaseException] = None
        self.done: Optional[asyncio.Event] = None
        self.updates = 0
        # snapshot id -> (its PartCollector, Event set once every actor answered), while pending
        self.pending_snapshots: dict = {}

    async def seed(self, xors: list) -> None:
        """Before any source starts: the stage actors' XORs of :meth:`StageActor.take_seed`."""
        for x in xors:
            self.acker.update(x)

    async def listen(self) -> tuple:
        self.done = asyncio.Event()
        return await self.endpoint.listen(node_ip())

    async def connect(self, subscribers: dict, addresses: dict, aligned_sources: Optional[list] = None) -> None:
        """``subscribers``: every stage actor by key, with its data-plane address;
        ``aligned_sources``: ``(key, group)`` of the source instances, by index, when they
        are told their source's frontier (aligned sources; ``group``: see
        :attr:`~driftstream.engine.model.plan.Plan.source_groups`)."""
        self.subscribers = subscribers
        self.aligned = aligned_sources
        for key in subscribers:
            await self.endpoint.connect(key, addresses[key])

    def _on_message(self, message: Any) -> None:
        if type(message) is Prepared:
            pending = self.pending_snapshots.get(message.snapshot_id)
            if pending is not None:  # else: a snapshot given up on (a reset happened since)
                collector, complete = pending
                if collector.add(message.instance, message.part):
                    complete.set()
            return
        self.acker.update(message.xors, message.source_index, message.bound)
        self.updates += 1
        if self.acker.watermark > self.pushed and not self.push_scheduled:
            self.push_scheduled = True
            asyncio.get_running_loop().call_soon(self._push)
        if message.bound is not None and self.aligned is not None and not self.align_scheduled:
            self.align_scheduled = True
            asyncio.get_running_loop().call_soon(self._align)

    def _align(self) -> None:
        """Tell the source instances the frontier, if it moved (coalesced like watermarks)."""
        self.align_scheduled = False
        told = self.frontier_told
        for group, frontier in {group: self.acker.frontier(group) for _, group in self.aligned}.items():
            if frontier > told.get(group, BOTTOM):
                told[group] = frontier
                for key, g in self.aligned:
                    if g == group:
                        self.endpoint.send(key, Align(frontier))

    def _push(self) -> None:
        self.push_scheduled = False
        w = self.acker.watermark
        if w <= self.pushed:
            return
        self.pushed = w
        if w == TOP:
            # The last watermark goes by Ray call so that the driver can wait for every
            # stage to have released its output before it collects results.
            refs = [h.watermark.remote(w) for h in self.subscribers.values()]
            asyncio.get_running_loop().create_task(self._finish(refs))
            return
        for key in self.subscribers:
            self.endpoint.send(key, Watermark(w))

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
                t, parts, missing = await self._snapshot(snapshot_id, timeout)
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

    async def _snapshot(self, snapshot_id: int, timeout: float) -> tuple:
        """Take snapshot ``snapshot_id`` at the current watermark T: returns ``(T, parts, missing)``.

        Each stage actor gets the marker after every earlier watermark (one FIFO
        connection from the acker), so it has not pruned past T when it snapshots;
        its part (``prepared``) comes back on its data-plane connection once durable.
        ``parts`` maps actor keys to parts, ``missing`` lists the keys that did not
        answer within ``timeout`` seconds (hung). T is TOP, with no parts, when the
        run is complete.
        """
        w = self.acker.watermark
        if w == TOP:
            return w, {}, []
        collector, complete = self.pending_snapshots[snapshot_id] = (PartCollector(snapshot_id, w, self.subscribers), asyncio.Event())
        for key in self.subscribers:
            self.endpoint.send(key, Watermark(w, snapshot_id))
        try:
            await asyncio.wait_for(complete.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self.pending_snapshots.pop(snapshot_id, None)
        return w, collector.parts, collector.missing

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
        return {"watermark": self.acker.watermark, "in_flight": self.acker.in_flight(), "updates": self.updates,
                "settled": self.acker.settled(), "bounds": list(self.acker.bounds)}

    async def close(self) -> None:
        await self.endpoint.close()
        if self.inbox is not None:
            await self.inbox.close()


@ray.remote(num_cpus=0)
class StageActor:
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
        self.source_task: Optional[asyncio.Task] = None
        self.gc_task: Optional[asyncio.Task] = None
        # A damaged snapshot file is reported by listen(), the launch's first call, as itself:
        # raised here it would reach the coordinator only as the text of a dead actor's error.
        self.setup_error: Optional[CorruptSnapshot] = None
        if self.key is not None:
            try:
                self._setup(config, plane)
            except CorruptSnapshot as exc:
                self.setup_error = exc

    async def reset(self, config: InstanceConfig, plane: PlaneKey, key: Optional[tuple] = None, plan: Optional[Plan] = None) -> dict:
        """Start over in this process from a snapshot (recovery of a survivor: no new process),
        as instance ``key`` when given (a standby taking a lost instance's place), of ``plan``
        when given (a rescale: the same flow at another parallelism). Returns
        where the time went: seconds of ``tear_down``, ``setup``, and ``restore`` within it.

        The old data-plane endpoint is closed first, so nothing sent before the
        reset can reach the new state.
        """
        t0 = time.perf_counter()
        if self.key is not None:
            await self._tear_down()
        t1 = time.perf_counter()
        if key is not None:
            self.key = Instance(*key)
        if plan is not None:
            self.plan = plan
        self.setup_error = None
        self._setup(config, plane)
        return {"tear_down": t1 - t0, "setup": time.perf_counter() - t1, "restore": self.snapshots.restore_s}

    async def playing(self) -> Optional[str]:
        """The name of the instance this actor plays (None: a standby not used yet)."""
        return None if self.key is None else self.plan.actor_name(self.key)

    async def _tear_down(self) -> None:
        if self.source_task is not None:
            self.source_task.cancel()
            self.source_task = None
        await self.endpoint.close()
        self._stop_sink_threads()
        self.rt.close()
        self.snapshots.close()
        if self.reader is not None:
            self.reader.close()

    def _stop_sink_threads(self) -> None:
        for pool in self.sink_threads.values():
            pool.shutdown(wait=True, cancel_futures=True)

    def _write_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        self.writes_idle.clear()
        future = asyncio.get_running_loop().run_in_executor(self.sink_threads[sid], sink.write, bundle)
        rt = self.rt
        future.add_done_callback(lambda f: self._bundle_written(rt, sid, bundle, f))

    def _bundle_written(self, rt: StageRuntime, sid: int, bundle: Any, future: Any) -> None:
        if future.cancelled() or rt is not self.rt:
            return  # written for an incarnation that was reset since
        error = future.exception()
        if self._guarded(self.rt.bundle_written, sid, bundle, error):
            if self.first_release_at is None:
                self.first_release_at = time.time()
                self.released.set()
            self._send_parts()
        if not self.rt.writing or self.failed:
            self.writes_idle.set()

    def _setup(self, config: InstanceConfig, plane: PlaneKey) -> None:
        plan, (stage_index, instance) = self.plan, self.key
        stage = plan.stages[stage_index]
        restore = config.restore
        self.snapshots = StageSnapshots(config.snapshot_dir, plan.participant(self.key), restore, cache_bytes=config.state_cache_bytes)
        self.rt = StageRuntime(
            plan,
            stage_index,
            instance,
            sample_every=config.sample_every,
            backend_factory=self.snapshots.backend,
            bundle_writer=self._write_bundle,
            merging=config.input_merge,
            restore_t=config.restore_t,
        )
        # One thread per sink partition: its bundles are written in order, and the event
        # loop goes on while the broker acknowledges one.
        self.sink_threads = {sid: ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink") for sid in self.rt.barriers}
        self.writes_idle = asyncio.Event()
        self.writes_idle.set()
        if config.skip_released:
            self.rt.skip_released()
        self.reader: Optional[SourceReader] = None
        self.source_index: Optional[int] = None
        if stage.source_id >= 0:
            step = plan.steps[stage.source_id]
            self.reader = SourceReader(
                step.source,
                step.id,
                instance,
                stage.parallelism,
                config.max_inflight,
                config.batch_size,
                starts=restore.positions(),
                alignment_slack=plan_alignment(plan, config.source_alignment),
            )
            self.source_index = plan.source_instances.index(self.key)
        self.batch_size = config.batch_size
        self.chaos = config.chaos
        self.rng = random.Random(config.seed)
        self.last_bound = None
        self.inbox: list = []
        self.drain_scheduled = False
        self.release_scheduled = False
        self.failed = False
        self.acker = None
        self.lost = LostPeers()
        self.endpoint = Endpoint(plane, self._on_message, me=self.plan.actor_name(self.key), on_lost=self.lost.add,
                                 on_error=self._on_plane_error)
        self.credit: Optional[asyncio.Event] = None
        self.first_release_at: Optional[float] = None
        self.released: Optional[asyncio.Event] = None

    async def first_release(self) -> float:
        """Wall time of this actor's first release to a sink (waits for it): recovery timing."""
        await self.released.wait()
        return self.first_release_at

    async def _freeze_survivors(self) -> None:
        """Every FREEZE_EVERY_S, move the objects that survived until now out of the cyclic
        garbage collector's reach (``gc.freeze``).

        A stateful actor's settled states are millions of long-lived containers (an inverted
        index's posting lists); one full collection over them paused the event loop for
        100+ ms, the tail of every latency figure. States are acyclic values, freed by
        reference counting when replaced, frozen or not; what freezing gives up is only
        cyclic garbage older than FREEZE_EVERY_S, which young collections have long
        since found.

        A backlog still made full collections within the second (a stateful instance
        allocates states faster than that), each over everything since the last freeze:
        16% of a stateful instance's CPU over a 6,000-document backlog, pauses up to
        150 ms. Survivors of a full collection are frozen as well
        (:mod:`.gc_policy`): 6%, pauses under 50 ms.
        """
        gc_policy.install()
        while True:
            await asyncio.sleep(FREEZE_EVERY_S)
            gc.freeze()

    async def listen(self) -> tuple:
        if self.setup_error is not None:
            raise self.setup_error
        if self.gc_task is None:  # once per process: listen() runs again after a reset
            self.gc_task = asyncio.get_running_loop().create_task(self._freeze_survivors())
        self.released = asyncio.Event()
        self.credit = asyncio.Event()
        return await self.endpoint.listen(node_ip())

    async def connect(self, acker, addresses: dict) -> None:
        """Open data-plane connections to the acker and to every instance of a downstream stage."""
        self.acker = acker
        await self.endpoint.connect("acker", addresses["acker"])
        stage = self.plan.stages[self.key[0]]
        downstream = {ch.dst_stage for sid in stage.step_ids for ch in self.plan.channels[sid]}
        for key in addresses:
            if key != "acker" and key[0] in downstream:
                await self.endpoint.connect(key, addresses[key])

    async def take_seed(self) -> dict:
        """Before :meth:`start`: the XORs of the timers of the windows this incarnation
        restored (:meth:`StageRuntime.take_seed`), for the acker's table."""
        return self.rt.take_seed()

    async def t_last(self) -> Optional[tuple]:
        """See :meth:`StageRuntime.t_last` (asked after a recovery)."""
        return self.rt.t_last()

    async def start(self, skip_after: Optional[tuple] = None) -> int:
        """Start reading. ``skip_after`` (at-most-once recovery): replay only up to that
        time, then skip to the live end; returns the number of records skipped."""
        skipped = 0
        if self.reader is not None:
            if skip_after is not None:
                skipped = self.reader.skip_after(skip_after)
            self.source_task = asyncio.get_running_loop().create_task(self._source_loop())
        return skipped

    async def pause_reading(self) -> Optional[tuple]:
        """Stop reading the source (a rescale's drain), once the reads in progress are sent with
        the bound that covers them; returns ``(source index, that bound)``: the acker has settled
        for the drain only once it holds it (the Ray call may overtake the data plane's message).
        None for a stage without a source."""
        if self.source_task is not None:
            self.source_task.cancel()
            try:
                await self.source_task
            except asyncio.CancelledError:
                pass
            self.source_task = None
            if not self.failed:
                self._flush()
        return None if self.reader is None else (self.source_index, self.last_bound)

    async def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading` (a drain given up on: the sinks held output past it)."""
        if self.reader is not None and self.source_task is None and not self.failed:
            self.source_task = asyncio.get_running_loop().create_task(self._source_loop())

    def _on_message(self, message: Any) -> None:
        if type(message) is Push:
            # Batches queued behind each other are processed together (see StageRuntime.receive_many).
            self.inbox.append(message.batch)
            if not self.drain_scheduled:
                self.drain_scheduled = True
                asyncio.get_running_loop().call_soon(self._drain, self.rt)
        elif type(message) is Align:
            self.reader.align(message.frontier)
            self.credit.set()  # a source loop waiting for the frontier reads on
        else:
            self._apply_watermark(message.t)
            if message.snapshot_id is not None:
                snapshot_id, t, rt = message.snapshot_id, message.t, self.rt

                def prepared(part: SnapshotPart) -> None:
                    if rt is self.rt:  # else: written for an incarnation that was reset since
                        rt.part_prepared(t, Prepared(snapshot_id, self.key, part))
                        self._send_parts()

                self.snapshots.take(snapshot_id, t, self.reader, prepared)

    async def alive(self) -> list:
        """The supervisor holds this call to learn at once when the actor dies (the call fails)
        or when it saw peers die: it returns their names (:class:`LostPeers`)."""
        return await self.lost.wait()

    async def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def _send_parts(self) -> None:
        """Send the snapshot parts whose T the sinks' acknowledged output has reached, in order."""
        for message in self.rt.ready_parts():
            self.endpoint.send("acker", message)

    def _drain(self, rt: StageRuntime) -> None:
        """Process the queued batches together, :data:`DRAIN_CHUNK` elements per callback.

        Batches queue up while the loop is busy; in a backlog, thousands of them. Taken
        at once they held the loop for seconds (a stateful step re-applying its keys),
        pings went unanswered and the supervisor replaced the actor as hung, over and
        over. In chunks, pings, watermarks and sink acknowledgements get a turn between.

        A state cache over its budget while a base is written (it may spill nothing
        until the base is durable) holds processing back until the writer is done:
        memory stays within the budget instead of growing with the backlog.

        ``rt``: the incarnation the callback was scheduled for; one scheduled before a
        reset does nothing (it would flush the new incarnation before it is connected)."""
        if rt is not self.rt:
            return
        if self.snapshots.over_budget():
            self.snapshots.slice_s = MAX_WRITER_SLICE_S
            asyncio.get_running_loop().call_later(BUDGET_WAIT_S, self._drain, rt)
            return
        inbox, n, size = self.inbox, 0, 0
        while n < len(inbox) and size < DRAIN_CHUNK:
            size += len(inbox[n].items)
            n += 1
        batches, self.inbox = inbox[:n], inbox[n:]
        backlogged = bool(self.inbox)
        if backlogged:
            asyncio.get_running_loop().call_soon(self._drain, rt)
        else:
            self.drain_scheduled = False
        started = time.perf_counter()
        if self._guarded(self.rt.receive_many, batches):
            rt.more = backlogged
            self._flush()
        self._release_later(rt)
        # The snapshot writer's next turn lasts as long as this callback did (within bounds): a
        # snapshot gets about half of a busy loop. With 1 ms turns behind each 50-100 ms of
        # processing, a base of 17k entries (~0.1 s of work) took 15 s in a backlog, and the
        # changes waiting for it grew past the budget. At low rates a callback takes well
        # under a millisecond, so turns stay short: every element in flight waits behind each.
        took = time.perf_counter() - started
        self.snapshots.slice_s = min(MAX_WRITER_SLICE_S, max(SLICE_S, took))

    def _release_later(self, rt: StageRuntime) -> None:
        """The input merge holds items for a sender that may have gone quiet: look again
        once it has been quiet long enough (the most any item is held)."""
        if rt.holding and not self.release_scheduled:
            self.release_scheduled = True
            asyncio.get_running_loop().call_later(rt.merge.quiet_s, self._release_held, rt)

    def _release_held(self, rt: StageRuntime) -> None:
        if rt is not self.rt:
            return  # scheduled for an incarnation that was reset since
        self.release_scheduled = False
        if self._guarded(rt.release_held):
            rt.more = bool(self.inbox)
            self._flush()
        self._release_later(rt)

    async def watermark(self, w: tuple) -> None:
        """The last watermark: returns once the sinks acknowledged everything it released."""
        self._apply_watermark(w)
        await self.writes_idle.wait()

    def _apply_watermark(self, w: tuple) -> None:
        ok = self._guarded(self.rt.on_watermark, w)
        if ok and (self.rt.outbound or self.rt.acks):
            self._flush()  # windows the watermark closed, and their timers
        if ok and self.reader is not None:
            self.reader.on_watermark(w)
            self.credit.set()

    async def report(self) -> dict:
        """Stop, close sinks and backends, and hand back outputs and metrics (copies: Ray
        serialises the result outside the event loop)."""
        if self.source_task is not None:
            self.source_task.cancel()
            self.source_task = None
        if not self.failed:
            await self.writes_idle.wait()
        self.failed = True  # nothing more is processed in this incarnation
        self._stop_sink_threads()
        self.rt.close()
        self.snapshots.close()
        await self.endpoint.close()
        metrics = self.rt.metrics()
        metrics["state_cache"] = self.snapshots.cache_stats()
        metrics["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        if self.reader is not None:
            metrics["first_read_at"] = self.reader.first_read_at
            self.reader.close()
        return {
            "collected": self.rt.collected(),
            "metrics": metrics,
            "emit_times": dict(self.rt.emit_times),
            "release_times": dict(self.rt.release_times),
        }

    async def ping(self) -> bool:
        return True

    async def stats(self, releases_since: Optional[float] = None, emits_of: Optional[list] = None) -> dict:
        """Progress counters for ``FlowHandle.status()``; with ``releases_since``, the release
        latency samples noted since then, and with ``emits_of``, the emit samples of those
        times (:mod:`~driftstream.engine.model.live_figures`)."""
        reader, rt = self.reader, self.rt
        return {
            "elements": dict(rt.counts),
            "tombstones": rt.tombstones_emitted(),
            "out_of_order": rt.out_of_order(),
            "releases": [] if releases_since is None else recent_samples(rt.release_times, releases_since),
            "emits": emit_samples(rt.emit_times, emits_of) if emits_of else {},
            "emitted": 0 if reader is None else reader.emitted,
            "source_lag": None if reader is None else reader.lag(),
            "source_partitions": [] if reader is None else reader.fetch_states(),
            "released": self.rt.released_total(),
            "state_cache": self.snapshots.cache_stats(),
            "late_elements": self.rt.late_elements(),
            "step_dead_letters": dict(self.rt.dead_letters),
        }

    def _on_plane_error(self, peer: str, exc: BaseException) -> None:
        """A message this actor could not load or handle: the run fails with it."""
        if not self.failed:
            self.failed = True
            self.acker.fail.remote(DataPlaneError(peer, self.plan.actor_name(self.key), f"{type(exc).__name__}: {exc}"))

    def _guarded(self, fn, *args) -> bool:
        """Run ``fn(*args)`` unless the run has failed; a StepError fails the run. True if it ran."""
        if self.failed:
            return False
        try:
            fn(*args)
            return True
        except StepError as exc:
            self.failed = True
            self.acker.fail.remote(exc)
            return False

    def _flush(self) -> int:
        """Send what the stage has for others, its acks and its source's bound; returns the
        elements sent to other stages."""
        send, sent = self.endpoint.send, 0
        for stage, inst, batch in self.rt.take_batches():
            sent += len(batch.items)
            if self.chaos:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, self.chaos), send, (stage, inst), Push(batch))
            else:
                send((stage, inst), Push(batch))
        acks = self.rt.take_acks()
        bound = None
        if self.reader is not None:
            bound = self.reader.bound()
            if bound == self.last_bound:
                bound = None
            else:
                self.last_bound = bound
        if acks or bound is not None:
            send("acker", Ack(acks, self.source_index, bound))
        return sent

    async def _source_loop(self) -> None:
        reader = self.reader
        while not reader.done and not self.failed:
            if not reader.has_credit():
                self.credit.clear()
                await self.credit.wait()
                continue
            try:
                items = reader.poll(self.batch_size)
            except Exception as exc:
                # A source that cannot read on (a codec not installed, a broker gone for its
                # broker_timeout_s) would fail the same way after a recovery: the run fails.
                self.failed = True
                self.acker.fail.remote(exc)
                return
            if items and not self._guarded(self.rt.process_source, items):
                return
            # Records left to read (a full read, or a known lag) mean the receivers' input merge
            # waits for this instance's next batch (ordering/input_merge.py), even out of credit:
            # the items they hold for it do not hold the watermark (StageRuntime._hold_at_held),
            # so its credit comes back.
            self.rt.more = bool(items) and (len(items) >= self.batch_size or bool(reader.lag()))
            sent = self._flush()
            if items:
                reader.made(len(items), sent)
            if items:
                await asyncio.sleep(0)
            elif reader.waiting():
                # Every partition with data waits for the frontier: the next Align wakes it.
                self.credit.clear()
                try:
                    await asyncio.wait_for(self.credit.wait(), 0.01)
                except asyncio.TimeoutError:
                    pass
            else:
                wait = reader.next_ready_in()
                await asyncio.sleep(min(wait if wait is not None else 0.001, 0.01))
        if not self.failed:
            self._flush()
