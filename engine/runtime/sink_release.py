"""The sinks of one stage instance: each barrier's release of settled output with one bundle
in flight per sink partition (the bundle protocol), the watermark below which each sink
holds all its output, and the snapshot parts that wait for it.

>>> from driftstream.barriers.barrier import Barrier
>>> from driftstream.engine.connectors.memory import MemorySink
>>> from driftstream.ordering.meta import Meta
>>> barrier, sink = Barrier(), MemorySink("out").open(0, 1)
>>> sinks = SinkRelease({7: (barrier, sink)}, step_name=lambda sid: "out")
>>> from driftstream.engine.model.manifest import SnapshotPart
>>> barrier.add(Meta(1, 0, 0, 1), "a")
>>> sinks.mark((5,))                                                 # a snapshot's marker at T=5
>>> sinks.part_prepared((5,), Prepared(1, (0, 0), SnapshotPart()))   # waits for the output below (5,)
>>> sinks.ready_parts(), sinks.release_all((9,))
([], None)
>>> [message.part.counts for message in sinks.ready_parts()]        # with what the sink settled below T
[RunCounts(released={'out': 1}, dead_letters={})]
>>> [p for _, p in sink.collected()]
['a']

Costs: :meth:`release_all` O(sinks) plus what the barriers release; :meth:`ready_parts`
O(sinks) when a part waits, O(1) otherwise.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Optional

from driftstream.ordering.meta import BOTTOM, TOP

from driftstream.engine.model.errors import is_dead_letter
from driftstream.engine.model.run_counts import RunCounts
from driftstream.engine.runtime.latency_samples import LatencySamples
from driftstream.engine.runtime.operators import step_error
from driftstream.engine.runtime.protocol import Prepared


class SinkRelease:
    """``barriers``: sink step id -> ``(Barrier, sink partition)``. ``write_bundle(sid, sink,
    bundle)`` hands a released bundle to its sink and must call :meth:`bundle_written` once
    the sink has it (default: write now, in this call). ``releases``: samples of the
    released elements' times; ``step_name(sid)``: for errors."""

    def __init__(self, barriers: dict, write_bundle: Optional[Callable[[int, Any, Any], None]] = None,
                 releases: Optional[LatencySamples] = None, clock: Callable[[], float] = time.time,
                 step_name: Callable[[int], str] = str) -> None:
        self.barriers = barriers
        self.write_bundle = write_bundle or self._write_now
        self.releases = releases if releases is not None else LatencySamples()
        self.clock = clock
        self.step_name = step_name
        self.watermark: tuple = BOTTOM
        #: sink steps with a bundle not yet acknowledged -> the watermark it was released at
        self.writing: dict = {}
        # Sink step -> a watermark below which all its output is acknowledged (see output_durable_through).
        self.durable: dict = {}
        # Snapshot parts, (T, part message), durable but waiting for the sinks to acknowledge
        # the output below T (see part_prepared).
        self.parts_waiting: deque = deque()
        for barrier, _ in barriers.values():
            barrier.settled.decide = _letters_by_step  # a sink of dead letters counts them per failing step

    def release_all(self, watermark: tuple) -> None:
        """Release, at each sink, what ``watermark`` settled (see :meth:`_release`)."""
        self.watermark = watermark
        for sid in self.barriers:
            self._release(sid)

    def _release(self, sid: int) -> None:
        """Release what the watermark settled, unless the sink still has a bundle to
        acknowledge: the bundle protocol keeps one bundle in flight per sink partition,
        and what settles meanwhile leaves in the next one."""
        if sid in self.writing:
            return
        barrier, sink = self.barriers[sid]
        bundle = barrier.release(self.watermark)
        if bundle:
            self.writing[sid] = self.watermark
            self.write_bundle(sid, sink, bundle)
        else:
            self.durable[sid] = self.watermark

    def _write_now(self, sid: int, sink: Any, bundle: Any) -> None:
        try:
            sink.write(bundle)
        except Exception as exc:
            self.bundle_written(sid, bundle, exc)
        else:
            self.bundle_written(sid, bundle)

    def bundle_written(self, sid: int, bundle: Any, error: Optional[BaseException] = None) -> None:
        """The sink acknowledged ``bundle`` (or failed with ``error``: a StepError naming the
        sink and the bundle); then releases what settled while it was in flight."""
        released_at = self.writing.pop(sid, None)
        if error is not None:
            raise step_error(self.step_name(sid), bundle.t_last, bundle.payloads(), error) from error
        self.releases.add(bundle.elements, self.clock())
        if released_at is not None:
            # A watermark W means every element below W has arrived, and the bundle released
            # at W held every one of them not released before: below W this sink is durable.
            self.durable[sid] = released_at
        self._release(sid)

    def output_durable_through(self) -> tuple:
        """A watermark below which every sink has acknowledged all its output (TOP without
        sinks). A snapshot at T may only be answered once this reaches T: a replay restarts
        at T, so output below T that was released but never acknowledged (in flight when the
        actor was killed) would be lost. O(sinks)."""
        durable = self.durable
        return min((durable.get(sid, BOTTOM) for sid in self.barriers), default=TOP)

    def skip_released(self) -> None:
        """After a failure (exactly-once, at-most-once): each barrier drops replayed output up
        to the last bundle its sink already holds (a sink may drop part of it itself, see
        ``SinkPartition.skip_replayed``)."""
        for barrier, sink in self.barriers.values():
            barrier.skip_through(*sink.skip_replayed())

    def t_last(self) -> Optional[tuple]:
        """The latest ``t_last`` over the barriers: the last output any sink holds (None: nothing yet)."""
        lasts = [b.t_last for b, _ in self.barriers.values() if b.t_last is not None]
        return max(lasts) if lasts else None

    def mark(self, t: tuple) -> None:
        """A snapshot's marker at watermark ``t``: start counting what the sinks settle below
        ``t`` (see :mod:`driftstream.barriers.settled`); its part then carries the count."""
        for barrier, _ in self.barriers.values():
            barrier.settled.mark(t)

    def part_prepared(self, t: tuple, message: Any) -> None:
        """This instance's part of the snapshot at ``t`` is durable; ``message`` (a
        :class:`~.protocol.Prepared`) goes to the acker once the sinks have acknowledged every
        output below ``t`` (:meth:`ready_parts`): a replay from ``t`` would not produce that
        output again."""
        self.parts_waiting.append((t, message))

    def ready_parts(self) -> list:
        """The part messages whose T the sinks' acknowledged output has reached, oldest first,
        each part with what the sinks settled below its T (:meth:`counts_below`); they leave
        the waiting queue. O(1) when none is ready."""
        waiting, ready = self.parts_waiting, []
        if waiting:
            durable = self.output_durable_through()
            while waiting and waiting[0][0] <= durable:
                t, message = waiting.popleft()
                if type(message) is Prepared:
                    message = message._replace(part=replace(message.part, counts=self.counts_below(t)))
                ready.append(message)
        return ready

    def counts_below(self, t: tuple) -> Optional[RunCounts]:
        """What the sinks settled below ``t`` in this incarnation, final once their output
        below ``t`` is acknowledged; None if a sink was not marked at ``t`` (:meth:`mark`)."""
        marks = [barrier.settled.take_mark(t) for barrier, _ in self.barriers.values()]
        if any(m is None for m in marks):
            return None
        return RunCounts.of_settled(marks, map(self.step_name, self.barriers))

    def settled(self) -> RunCounts:
        """What the sinks settled in this incarnation so far: released, or dropped as replayed
        output the sink already held (O(sinks + failing steps))."""
        return RunCounts.of_settled((b.settled.counts for b, _ in self.barriers.values()), map(self.step_name, self.barriers))

    def released_total(self) -> int:
        """Elements released to sinks so far, over all the barriers (O(sinks))."""
        return sum(b.released for b, _ in self.barriers.values())

    def collected(self) -> dict:
        """Per sink name: the ``(meta, payload)`` pairs an in-memory sink partition holds."""
        out = {}
        for sid, (_, sink) in self.barriers.items():
            got = sink.collected()
            if got is not None:
                out[self.step_name(sid)] = got
        return out

    def close(self) -> None:
        for _, sink in self.barriers.values():
            sink.close()


def _letters_by_step(payload: Any) -> Optional[Callable[[Any], str]]:
    """How a sink whose first element is ``payload`` counts what it settles: a dead letter's
    sink per failing step, any other sink as one count (None)."""
    return _letter_step if is_dead_letter(payload) else None


def _letter_step(letter: Any) -> Optional[str]:
    return letter.step if is_dead_letter(letter) else None
