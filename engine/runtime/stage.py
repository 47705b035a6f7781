"""One instance of a stage, as pure Python: the same object runs inside a Ray actor
and inside the simulator.

It takes batches (or source reads), runs the fused chain of steps over them,
buffers what leaves the stage per destination instance, and accumulates the
XOR acks of everything it received and sent. The runtime around it moves
batches, flushes acks to the acker and delivers watermarks.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> flow = Flow("doc")
>>> flow.source(MemorySource(["a", "b"])).map(str.upper).sink(MemorySink("out"))
>>> stage = StageRuntime(flow.plan(1), stage_index=0, instance=0, seed=1)
>>> stage.process_source([(Meta(0, 0, 0, 0), "a"), (Meta(1, 0, 0, 1), "b")])
>>> stage.on_watermark(TOP)
>>> [p for _, p in stage.collected()["out"]]
['A', 'B']
"""

from __future__ import annotations


import random
import time
from typing import Any, Callable, Optional

from driftstream.ordering.ack_table import AckTable
from driftstream.ordering.input_merge import InputMerge
from driftstream.ordering.meta import BOTTOM, TOP, Meta  # noqa: F401  (TOP: the doctest)
from driftstream.snapshots.state_keys import StateKeys

from driftstream.engine.model.errors import StepError
from driftstream.engine.model.plan import Plan
from driftstream.engine.runtime.latency_samples import LatencySamples
from driftstream.engine.runtime.logged_step import LoggedStep
from driftstream.engine.runtime.outbound import Batch, ChannelOutbound, Outbound, tagged  # noqa: F401  (Batch: re-exported)
from driftstream.engine.runtime.operator_registry import operator_for
from driftstream.engine.runtime.operators import StepContext
from driftstream.engine.runtime.sink_release import SinkRelease


#: Latency samples one instance keeps per point (emit, release) before it thins them.
MAX_SAMPLES = 1 << 16
#: How long a sender may stay silent before the input merge stops holding the others back
#: for it (see ordering/input_merge.py), and how long if it said it had more to send.
MERGE_QUIET_S = 0.002
MERGE_MAX_HOLD_S = 1.0


class StageRuntime:
    """The fused chain of one stage instance, with its keyed state and barriers."""

    def __init__(
        self,
        plan: Plan,
        stage_index: int,
        instance: int,
        seed: Optional[int] = None,
        clock: Callable[[], float] = time.time,
        sample_every: int = 1,
        max_samples: int = MAX_SAMPLES,
        backend_factory: Optional[Callable[[str, Callable, bool, StateKeys], Any]] = None,
        bundle_writer: Optional[Callable[[int, Any, Any], None]] = None,
        sink_opener: Optional[Callable[[int, int], Any]] = None,
        merging: bool = True,
        restore_t: Optional[tuple] = None,
        incarnations: Optional[dict] = None,
        incarnation: Any = None,
    ) -> None:
        """``bundle_writer(sid, sink, bundle)`` hands a released bundle to its sink and
        must call :meth:`bundle_written` once the sink has it; default: write now, in
        this call. The Ray runtime writes in a thread so the event loop never waits
        for a broker's acknowledgement. ``sink_opener(step id, instance)`` opens a sink
        partition (default: the step's sink opens a new one); the simulator hands a
        restarted instance the partition its predecessor wrote, as a durable sink would.

        Latency samples (``emit_times``, ``release_times``: time -> wall clock) are kept
        for the elements whose offset is a multiple of ``sample_every``, at most
        ``max_samples`` of each (:class:`.latency_samples.LatencySamples`).

        ``incarnations`` (``recovery="local"``; the simulator's only so far): every instance's
        current incarnation, kept current by the runtime; acks are then keyed ``(channel, t)``,
        a batch's in the table of its channel (see ordering/channel_tables.py). ``incarnation``:
        this runtime's own when it is not ``incarnations``' (a replica that is not the primary)."""
        self.plan = plan
        self.stage = plan.stages[stage_index]
        self.instance = instance
        self.key = (stage_index, instance)
        # Not merging: nobody is ever active but a sender in the very call it offers in.
        self.merge = InputMerge(MERGE_QUIET_S, MERGE_MAX_HOLD_S) if merging else InputMerge(0.0, 0.0)
        #: set by the runtime before it takes batches: whether more output follows at once
        #: (its input is backlogged), told to the receivers' input merge
        self.more = False
        self.rng = random.Random(seed)
        self.clock = clock
        self.watermark: tuple = BOTTOM
        self.acks = AckTable()
        # The timers of restored windows: XORs the acker must hold before any source starts,
        # apart from ``acks`` (which any flush may send) until the runtime takes them (take_seed).
        self.seed_acks = AckTable()
        # Emits: read by a source, or fired by a window (a window's result is timed from its close).
        self.emits = LatencySamples(sample_every, max_samples)
        self.releases = LatencySamples(sample_every, max_samples)
        self.peak_log_entries = 0
        #: per step with on_error="dead-letter": its dead letters (less their tombstones)
        self.dead_letters: dict = {}
        self.failure: Optional[StepError] = None
        #: recovery="local": the instances' incarnations (None: one acker table, the default path)
        self.incarnations = incarnations
        new_id = lambda: self.rng.getrandbits(64) or 1  # noqa: E731
        #: what leaves the stage, in a batch per destination instance and step
        self.outbound = (Outbound(plan, instance, new_id) if incarnations is None
                         else ChannelOutbound(plan, instance, new_id, incarnations, incarnations[self.key] if incarnation is None else incarnation))
        ctx = StepContext(plan, instance, backend_factory, sink_opener, lambda: self.rng.getrandbits(64),
                          lambda: self.acks, self.seed_acks, self.dead_letters, restore_t)
        #: step id -> its operator, for the steps of this stage
        self.operators: dict = {sid: operator_for(plan.steps[sid], ctx) for sid in self.stage.step_ids}
        ops = self.operators.items()
        # What reports and snapshots read, by what each operator says it keeps.
        self.keyed: dict = {sid: op.state for sid, op in ops if op.state is not None and not op.timed}
        self.windows: dict = {sid: op.state for sid, op in ops if op.timed}  # window step id -> WindowedState
        self.barriers: dict = {sid: (op.barrier, op.sink) for sid, op in ops if op.barrier is not None}
        #: step id -> the output log of a step declared deterministic=False (see logged_step.py)
        self.output_logs: dict = {sid: op.log for sid, op in ops if type(op) is LoggedStep}
        #: the barriers' releases, the bundles in flight and the snapshot parts waiting for them
        self.sinks = sinks = SinkRelease(self.barriers, bundle_writer, self.releases, clock, lambda sid: plan.steps[sid].name)
        # The sinks' side of this instance's API (see SinkRelease).
        self.bundle_written, self.part_prepared, self.ready_parts = sinks.bundle_written, sinks.part_prepared, sinks.ready_parts
        self.t_last, self.skip_released, self.released_total = sinks.t_last, sinks.skip_released, sinks.released_total
        self.output_durable_through, self.collected = sinks.output_durable_through, sinks.collected

    @property
    def emit_times(self) -> dict:
        """Sampled emits: ``t[:4]`` -> wall clock (see ``emits``)."""
        return self.emits.times

    @property
    def release_times(self) -> dict:
        """Sampled releases: ``t[:4]`` -> wall clock (see ``releases``)."""
        return self.releases.times

    def work(self) -> int:
        """The elements this stage's steps took so far, summed over its steps. O(steps)."""
        return sum(op.count for op in self.operators.values())

    @property
    def counts(self) -> dict:
        """Per step of this stage: the elements it took so far."""
        return {op.name: op.count for op in self.operators.values()}

    # -- data in ------------------------------------------------------------------------

    def process_source(self, items: list) -> None:
        """Run elements read by this stage's source, ``(meta, payload)`` pairs, through the chain."""
        self.emits.add(items, self.clock())
        self.process(self.stage.source_id, [(m, p, None) for m, p in items])

    def receive(self, batch: Batch) -> None:
        """Process a batch from another stage and ack it."""
        self.receive_many([batch])

    def receive_many(self, batches: list) -> None:
        """Take several batches as one (per entry step); process what the input merge
        releases of them, in t order, and ack each batch once all of it is processed.

        Batches that arrived together are applied together: a stateful step re-applies
        each key at most once for all of them. The merge holds a sender's items that run
        ahead of another active sender's (see :mod:`driftstream.ordering.input_merge`):
        a stateful step then lands them in order instead of repairing them.
        """
        now, offer = self.clock(), self.merge.offer
        for batch in batches:
            offer(batch.sender, batch.entry, batch.items, batch, now, batch.more)
        self._process_released(*self.merge.take(now))

    @property
    def holding(self) -> bool:
        """Whether the input merge holds items back (:meth:`release_held` lets them go)."""
        return self.merge.holding

    def release_held(self, everything: bool = False) -> None:
        """Process what the input merge releases now: the items of senders that went quiet
        (the runtime calls this ``merge.quiet_s`` after holding began), or ``everything``."""
        self._process_released(*(self.merge.take_all() if everything else self.merge.take(self.clock())))

    def _process_released(self, released: dict, done: list) -> None:
        for entry, items in released.items():
            self.process(entry, items)
        acks = self.acks
        if self.incarnations is None:
            for batch in done:
                acks.xor_many(batch.times, batch.batch_id)
        else:  # recovery="local": in the table of the batch's channel
            for batch in done:
                acks.xor_many([(batch.channel, t) for t in batch.times], batch.batch_id)
        if self.merge.holding:
            self._hold_at_held(acks)

    def _hold_at_held(self, acks: AckTable) -> None:
        """A batch partly released holds the watermark only at its least held item: its
        entry moves there, as a sender's ``outbound._OutBuffer`` moves one (the XORs go to the
        acker in one message with those of the outputs just made). Held at its first
        item, it kept the watermark below the other senders' items, and a source
        waiting for the watermark to return credit stayed silent until the merge gave
        up on it: its next batch then landed behind the held ones, out of order."""
        for batch, meta in self.merge.partly_released():
            times = batch.times
            t = meta[:4]
            if len(times) == 1 and times[0] < t:
                if self.incarnations is None:
                    acks.move(times[0], t, batch.batch_id)
                else:
                    acks.move((batch.channel, times[0]), (batch.channel, t), batch.batch_id)
                batch.times = [t]

    def process(self, entry: int, items: list) -> None:
        """Run ``items`` from step ``entry`` through the rest of the stage."""
        self._run({entry: items})

    def process_outputs(self, sid: int, outs: list) -> None:
        """Step ``sid``'s outputs, drawn elsewhere (a replica's primary's, see replica_draws.py),
        through the rest of the stage and out on its channels."""
        pending: dict = {}
        self._pass_on(sid, outs, pending)
        self._run(pending)

    def _run(self, pending: dict) -> None:
        """Run the stage's steps in order over ``pending`` (step id -> its input items)."""
        operators = self.operators
        for sid in self.stage.step_ids:
            batch = pending.pop(sid, None)
            if not batch:
                continue
            op = operators[sid]
            op.count += len(batch)
            outs = op.run(batch)
            if outs:
                self._pass_on(sid, outs, pending)
        if self.keyed:
            size = sum(k.log_size() for k in self.keyed.values())
            if size > self.peak_log_entries:
                self.peak_log_entries = size

    def _pass_on(self, sid: int, outs: list, pending: dict) -> None:
        """Step ``sid``'s outputs to its successors in this stage (``pending``) and to its channels."""
        for succ, tag in self.plan.successors[sid]:
            items_in = outs if tag is None else tagged(outs, tag)
            if succ in pending:
                pending[succ] = pending[succ] + items_in
            else:
                pending[succ] = items_in
        route, acks = self.outbound.route, self.acks
        for ch in self.plan.channels[sid]:
            route(ch, outs, acks)

    # -- data out -----------------------------------------------------------------------

    def take_batches(self) -> list:
        """``(stage index, instance, Batch)`` for every non-empty output buffer; empties them."""
        return self.outbound.take(self.key, self.more)

    def take_seed(self) -> dict:
        """The XORs of the timers of restored windows (see ``seed_acks``), once."""
        return self.seed_acks.drain()

    def take_acks(self) -> dict:
        """The XORs accumulated since the last call (to send to the acker)."""
        return self.acks.drain()

    # -- watermark ----------------------------------------------------------------------

    def on_watermark(self, watermark: tuple) -> None:
        """Fold settled keyed state and release settled output; ignores stale watermarks."""
        if watermark <= self.watermark:
            return
        self.watermark = watermark
        operators = self.operators
        for op in operators.values():
            op.settle(watermark)
        for sid, op in operators.items():
            fired = op.on_watermark(watermark)
            if fired:
                # A result's latency sample starts when its window closed: the time the
                # watermark reached its close (its elements' own samples end in the window).
                self.emits.add(fired, self.clock())
                pending: dict = {}
                self._pass_on(sid, fired, pending)
                self._run(pending)
        self.sinks.release_all(watermark)

    # -- results ------------------------------------------------------------------------

    def late_elements(self) -> dict:
        """Per window step: the elements that reached a window after it closed."""
        return {self.plan.steps[sid].name: ws.late for sid, ws in self.windows.items()}

    def tombstones_emitted(self) -> dict:
        """Per stateful step (keyed or timed): the tombstones it emitted so far. O(steps)."""
        steps = self.plan.steps
        return {steps[sid].name: ks.tombstones_emitted for sid, ks in (*self.keyed.items(), *self.windows.items())}

    def out_of_order(self) -> dict:
        """Per stateful step: the elements that landed before the tail of their key's log (its
        state rolled back and re-applied from them). O(steps)."""
        steps = self.plan.steps
        return {steps[sid].name: ks.out_of_order for sid, ks in (*self.keyed.items(), *self.windows.items())}

    def metrics(self) -> dict:
        steps = self.plan.steps
        return {
            "elements": dict(self.counts),
            "tombstones_emitted": self.tombstones_emitted(),
            "out_of_order": self.out_of_order(),
            "late_elements": self.late_elements(),
            "step_dead_letters": dict(self.dead_letters),
            "tombstones_at_sinks": {steps[sid].name: b.tombstones_released for sid, (b, _) in self.barriers.items()},
            # released, or dropped as replayed output the sink held (see barriers/settled.py)
            "released": {steps[sid].name: b.settled.total() for sid, (b, _) in self.barriers.items()},
            "peak_log_entries": self.peak_log_entries,
            "log_entries": sum(k.log_size() for k in (*self.keyed.values(), *self.windows.values())),
        }

    def close(self) -> None:
        self.sinks.close()
