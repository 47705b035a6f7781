"""A stage instance's protocol, written once: what one incarnation of an instance does with
a message and what it sends, in order. The Ray :class:`~.actors.StageActor` drives it over
the data plane from its event loop (with its batch queue, source pump and sink writer
threads); the simulator (:mod:`.simulator`) drives it under its seeded scheduler. Only
the transport (``send``), what a failure does (``fail``) and the scheduling differ.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> from driftstream.engine.model.config import InstanceConfig
>>> from driftstream.engine.runtime.stage_snapshots import StageSnapshots
>>> f = Flow("host")
>>> f.source(MemorySource([1, 2])).sink(MemorySink("o"))
>>> plan, sent = f.plan(1), []
>>> key = plan.instances[0]
>>> host = InstanceHost(plan, key, InstanceConfig(), StageSnapshots(None, plan.participant(key), None),
...                     send=lambda to, message: sent.append((to, type(message).__name__)))
>>> host.guarded(host.rt.process_source, host.reader.poll(2)), host.flush(), sent
(True, 0, [('acker', 'Ack')])
>>> host.on_message(Watermark((9,))); [p for _, p in host.rt.collected()["o"]]
[1, 2]
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.errors import StepError
from driftstream.engine.model.manifest import SnapshotPart
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.instance_recovery import InstanceRecovery
from driftstream.engine.runtime.output_logs import OutputLogs
from driftstream.engine.runtime.protocol import Ack, Align, Drawn, DrawsHeld, Prepared, Push, ReplaySent, Watermark
from driftstream.engine.runtime.reexecuted_step import reexecuted
from driftstream.engine.runtime.stage import StageRuntime
from driftstream.engine.runtime.stage_snapshots import StageSnapshots

#: Where an instance sends its acks, bounds and snapshot parts.
ACKER = "acker"


def raise_it(exc: BaseException) -> None:
    """The simulator's ``fail``: the run stops with the error, raised."""
    raise exc


class InstanceHost:
    """One incarnation of stage instance ``key`` of ``plan``: its :class:`StageRuntime`
    (over ``snapshots``' backends) and its source reader, wired to the protocol.

    ``send(to, message)``: a :class:`Push` to another instance ``(stage, index)``, or an
    :class:`Ack` / :class:`Prepared` to :data:`ACKER`; ``fail(exc)``: the run fails with
    ``exc`` (a step's error, or a batch the transport refused); ``runtime``: the rest of
    :class:`StageRuntime`'s options (``bundle_writer``, ``seed``, ``clock``...).
    ``source``: what a watermark or a frontier wakes (the Ray actor's pump; default: the
    reader). After :meth:`close` nothing an earlier callback finishes reaches the runtime.
    ``corrupted(SilentCorruption)``: under ``verify="reexecute:N"``, what a re-run or a settled
    read that disagreed does (default: raise it; the simulator rolls the run back); ``verifier``
    (a :class:`~.verifier_link.VerifierLink`): the re-runs go to the flow's verifier, and this
    instance's snapshot parts wait for the verdicts below their T (None: re-run in this process).
    """

    def __init__(self, plan: Plan, key: Instance, config: InstanceConfig, snapshots: StageSnapshots, send: Callable[[Any, Any], None],
                 fail: Callable[[BaseException], None] = raise_it, corrupted: Callable[[BaseException], None] = raise_it,
                 verifier: Any = None, **runtime: Any) -> None:
        self.key, self.snapshots, self._send, self._fail = key, snapshots, send, fail
        self.rt = StageRuntime(plan, *key, backend_factory=snapshots.backend, merging=config.input_merge, restore_t=config.restore_t, **runtime)
        if config.reexecute is not None:  # verify="reexecute:N": keyed steps re-run one batch in N (see reexecuted_step.py)
            reexecuted(self.rt, config.reexecute, config.seed or 0, corrupted, config.restore_t, verifier)
        #: verify="reexecute:N" on the verifier: its link, which holds the snapshot parts back (None: the default path)
        self.verifier = verifier
        if verifier is not None:
            # a verdict after this incarnation closed (a recovery reset the actor) is of what was rolled back
            verifier.wire(lambda exc: None if self.closed else corrupted(exc), self._part_ready)
        incarnations = runtime.get("incarnations")
        #: recovery="local": this incarnation's side of it (its log, inputs taken, cut; None: the default path)
        self.recovery: Optional[InstanceRecovery] = None if incarnations is None else InstanceRecovery(incarnations, key, runtime.get("incarnation"))
        #: the output logs of the stage's steps declared deterministic=False (None: it has none,
        #: and messages go to the acker as they come)
        self.output_logs = OutputLogs.of(self.rt, plan, key, config, lambda message: self._send(ACKER, message), config.recovering)
        if config.skip_released:
            self.rt.skip_released()
        self.reader: Optional[SourceReader] = SourceReader.of_instance(plan, key, config)
        self.source_index = None if self.reader is None else plan.source_instances.index(key)
        self.source: Any = self.reader
        #: the bound last sent to the acker (TOP once the source has read everything)
        self.last_bound: Any = None
        self.failed = self.closed = False
        #: replicas > 1 and steps declared deterministic=False: this replica's side of their draws
        #: (replica_draws.py; None: the default path)
        self.draws: Any = None

    def guarded(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` unless the run has failed; a StepError fails the run. True if it ran."""
        if self.failed:
            return False
        try:
            fn(*args)
            return True
        except StepError as exc:
            self.fail(exc)
            return False

    def fail(self, exc: BaseException) -> None:
        """The run fails with ``exc``; this incarnation processes nothing more."""
        self.failed = True
        self._fail(exc)

    # -- what it sends ---------------------------------------------------------------------

    def flush(self) -> int:
        """Send what the stage has for others, then its acks and its source's new bound in one
        :class:`Ack`, then the snapshot parts its sinks' acknowledged output allows; returns
        the elements sent to other stages. O(batches + acks)."""
        rt, send, sent, recovery = self.rt, self._send, 0, self.recovery
        for stage, inst, batch in rt.take_batches():
            if recovery is not None:  # logged; a replacement's output below its cut dropped
                batch = recovery.sent((stage, inst), batch, rt.acks)
                if batch is None:
                    continue
            sent += len(batch.items)
            send((stage, inst), Push(batch))
            if self.failed:
                return sent  # the transport refused the batch: the run fails and says why
        acks = rt.take_acks()
        bound = self.new_bound()
        if acks or bound is not None:
            ack = Ack(acks, self.source_index, bound)
            if recovery is not None:
                ack = recovery.tagged(ack)
            if self.output_logs is None:
                send(ACKER, ack)
            else:  # after what its output logs recorded is durable
                self.output_logs.to_acker(ack)
        self.send_parts()
        return sent

    def flush_read(self, more: bool) -> int:
        """:meth:`flush` after a source read; ``more``: records are left to read, so the
        receivers' input merge waits for this instance's next batch."""
        self.rt.more = more
        return self.flush()

    def new_bound(self) -> Any:
        """The reader's bound if it moved since it was last sent, else None. O(partitions)."""
        if self.reader is None:
            return None
        bound = self.reader.bound()
        if bound == self.last_bound:
            return None
        self.last_bound = bound
        return bound

    def send_parts(self) -> None:
        """Send the snapshot parts whose T the sinks' acknowledged output has reached, in order."""
        for message in self.rt.ready_parts():
            self._to_acker(message)

    def _to_acker(self, message: Any) -> None:
        """Send ``message`` to the acker; with output logs, once what they recorded is durable."""
        if self.output_logs is None:
            self._send(ACKER, message)
        else:
            self.output_logs.to_acker(message)

    def peer_failed(self, victim: Instance, new: Any, cut: tuple, batch_size: int, reconnect: Callable[[], None] = lambda: None,
                    replay: bool = True, since: Optional[tuple] = None) -> None:
        """``recovery="local"``: peer ``victim`` failed and incarnation ``new`` replaces it; the
        acker holds at the snapshot ``new`` restores until this instance's :class:`ReplaySent`.
        What it holds for the dead one goes to it first, on the old channel (lost, but
        logged: sent to the replacement, its hold would sit in a discarded table); then
        ``reconnect()`` (the transport's switch to the replacement), its part
        (:meth:`.InstanceRecovery.peer_failed`: held inputs, cancels, the replay), and the
        ReplaySent behind the Ack of all that. ``replay`` False: ``new`` is a live replica of
        ``victim`` (already caught up: nothing is re-sent to it). ``since``: the snapshot time ``new``
        restores, where its log may hold more (the simulator under votes keeps it from the
        snapshot they certified): only what is at or after it is re-sent."""
        self.flush()
        self.recovery.incarnations[victim] = new
        reconnect()
        for to, batch in self.recovery.peer_failed(self, victim, new, cut, batch_size, replay, since):
            self._send(to, Push(batch))
        self.flush()
        self._to_acker(ReplaySent(new, self.key))

    def write_output_logs(self) -> None:
        """Write what the output logs recorded, and send the acker messages that waited for it
        (the simulator's scheduling step; the Ray actor writes its own way, see actors.py)."""
        if not self.closed and self.output_logs is not None:
            self.output_logs.write_all()

    # -- what it does with a message ---------------------------------------------------------

    def receive(self, batches: list, more: bool = False) -> None:
        """Batches from other stages (see :meth:`StageRuntime.receive_many`); ``more``: more are
        queued behind them."""
        if self.recovery is not None:
            for batch in batches:
                self.recovery.received(batch)
        if self.guarded(self.rt.receive_many, batches):
            self.rt.more = more
            self.flush()

    def on_message(self, message: Any) -> None:
        """The acker's :class:`Watermark` (with a snapshot's marker) or :class:`Align`; with
        replicas, the primary's :class:`Drawn` (and, to a new primary, a :class:`DrawsHeld`)."""
        kind = type(message)
        if kind is Align:
            self.source.align(message.frontier)
            return
        if kind is Drawn or kind is DrawsHeld:
            self.draws.take(self, message)
            return
        self.apply_watermark(message.t)
        if self.recovery is not None:
            self.recovery.settled(message.t)
        if message.snapshot_id is not None:
            snapshot_id, t, rt = message.snapshot_id, message.t, self.rt
            rt.sinks.mark(t)  # the part carries what the sinks settle below t (run counts across recoveries)

            def prepared(part: SnapshotPart) -> None:
                if self.verifier is not None and not self.closed:  # after the verdicts of what was re-run below t
                    self.verifier.hold_part(t, Prepared(snapshot_id, self.key, part))
                    return
                self._part_ready(t, Prepared(snapshot_id, self.key, part))

            self.snapshots.take(snapshot_id, t, self.reader, prepared)

    def _part_ready(self, t: tuple, message: Prepared) -> None:
        """This instance's part of snapshot ``t`` goes to the acker (one the verifier's verdicts
        held back, once they came: see verifier_link.py), unless the incarnation that wrote it
        was reset since."""
        if not self.closed:
            self.rt.part_prepared(t, message)
            self.send_parts()

    def apply_watermark(self, w: tuple) -> None:
        """Fold and release what ``w`` settled, send what windows it closed made, return credit."""
        ok = self.guarded(self.rt.on_watermark, w)
        if ok and (self.rt.outbound or self.rt.acks):
            self.flush()  # windows the watermark closed, and their timers
        if ok and self.source is not None:
            self.source.on_watermark(w)

    def bundle_written(self, sid: int, bundle: Any, error: Optional[BaseException] = None) -> bool:
        """Sink step ``sid``'s partition has ``bundle`` (or failed with ``error``): send the
        snapshot parts that waited for it. True if the runtime took it."""
        if self.closed or not self.guarded(self.rt.bundle_written, sid, bundle, error):
            return False
        self.send_parts()
        return True

    def close(self, keep_sinks: bool = False) -> None:
        """End this incarnation: its runtime (and its sink partitions, unless ``keep_sinks``:
        the simulator's outlive a crash, as a topic does), backends and reader. Once:
        ``report()`` closes it at a run's end, and a warm actor's retirement after it again."""
        if self.closed:
            return
        self.closed = True
        if self.output_logs is not None:
            self.output_logs.close()
        if not keep_sinks:
            self.rt.close()
        self.snapshots.close()
        if self.reader is not None:
            self.reader.close()
