"""The operator of a keyed step under ``verify="reexecute:N"`` (issue 58): the step's own
operator (:class:`~.operators.Keyed`), one batch in ``N`` re-run on a copy of the touched keys
(:mod:`driftstream.ordering.reexecution`), and every read of its settled state checked against
what the engine wrote (:mod:`driftstream.ordering.written_digests`).

A difference is a :class:`SilentCorruption` (``record``: the step, the instance, the batch's t
range and what differed), handed to ``on_mismatch`` after the batch: the simulator rolls the
run back, a Ray stage actor reports it and exits so that the supervisor recovers the run.

>>> from driftstream.ordering.keyed_state import DriftingKeyedState
>>> from driftstream.engine.runtime.operators import Keyed
>>> found = []
>>> op = ReexecutedStep(Keyed("sum", DriftingKeyedState(lambda s, x: ((s or 0) + x, (s or 0) + x))), 1, 0, "0/0", found.append)
>>> [p for _, p, _ in op.run([((1, 0, 0, 1, (), False), 5, "k")])], op.reexecuted, found
([5], 1, [])

Costs: with ``N`` batches, ``(N - 1)`` of them cost a counter and a check of the corrupt reads;
one re-applies its keys' logs and itself on the copy (see reexecution.py); every fold and
every read of settled state costs a digest (see written_digests.py). Built only under
``verify="reexecute:N"`` (:func:`reexecuted`): the default path does not change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from driftstream.ordering.entry_state import EntryKeyedState
from driftstream.ordering.reexecution import Mismatch, copy_of
from driftstream.ordering.shipped_reexecution import ship
from driftstream.ordering.written_digests import CheckedEntries, CheckedValues

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.runtime.operators import Keyed, Operator


@dataclass
class CorruptionRecord:
    """A silent corruption caught: step ``step`` of instance ``instance`` (``"stage/index"``), on
    the batch of times ``t_range`` (its first and last element's), what differed (``found``:
    :class:`~driftstream.ordering.reexecution.Mismatch` es, or
    :class:`~driftstream.ordering.written_digests.CorruptRead` s of settled values) and the
    watermark the instance had then. ``before``: a snapshot must be below this time to hold the
    state right (the least ``since`` of the corrupt reads; None: any committed one, as a re-run's
    difference lies in the log, above every committed snapshot's time)."""

    step: str
    instance: str
    t_range: tuple
    found: list = field(default_factory=list)
    watermark: tuple = ()
    before: Optional[tuple] = None

    def line(self) -> str:
        """One log line: what was caught, where, with the two digests of each difference."""
        parts = [f"{getattr(f, 'kind', 'settled read')} {f.key!r}: {getattr(f, 'live', getattr(f, 'written', ''))} != "
                 f"{getattr(f, 'copy', getattr(f, 'read', ''))}" for f in self.found]
        return f"silent corruption in step {self.step!r} of {self.instance}, batch t {self.t_range[0]}..{self.t_range[1]}: " + "; ".join(parts)


class SilentCorruption(Exception):
    """A re-run or a settled read disagreed with the live state (``record`` says how)."""

    def __init__(self, record: CorruptionRecord) -> None:
        super().__init__(record.line())
        self.record = record


class ReexecutedStep(Operator):
    """``inner`` (a keyed step's operator) with its state's backend checked, and every
    ``every``-th batch (from ``phase``) re-run on a copy; ``on_mismatch(SilentCorruption)``
    after a batch that disagreed. ``state`` is the inner's: snapshots and reports see it.
    ``link`` (a :class:`~.verifier_link.VerifierLink`): the batch is re-run in the verifier's
    process instead, as plan step ``step_id``, and its verdict compared when it comes."""

    __slots__ = ("inner", "state", "every", "phase", "instance", "on_mismatch", "batches", "reexecuted", "watermark", "pending",
                 "link", "step_id", "arrivals")

    def __init__(self, inner: Keyed, every: int, phase: int, instance: str, on_mismatch: Callable[[SilentCorruption], None],
                 link: Any = None, step_id: int = -1) -> None:
        super().__init__(inner.name)
        self.inner, self.state, self.every, self.phase = inner, inner.state, every, phase % every
        self.instance, self.on_mismatch, self.link, self.step_id = instance, on_mismatch, link, step_id
        self.batches = self.reexecuted = 0
        self.watermark: tuple = ()
        self.pending: list = []  # the keys with a log the sweep has not checked yet (see _sweep)
        state = self.state
        if not isinstance(state.backend, (CheckedValues, CheckedEntries)):
            state.backend = (CheckedEntries if isinstance(state, EntryKeyedState) else CheckedValues)(state.backend)
        #: with a link, an entry state's: per key, ``(t, batch number)`` of its elements in arrival
        #: order (see _reads); None: not kept
        self.arrivals: Optional[dict] = None
        if link is not None and isinstance(state.backend, CheckedEntries):
            state.backend.track()  # a re-run elsewhere is shipped the entries its keys' logs read
            self.arrivals = {}

    def run(self, items: list) -> list:
        self.batches += 1
        if self.arrivals is not None:
            self._arrived(items)
        if self.batches % self.every != self.phase:
            out = self.inner.run(items)
            found: list = []
        elif self.link is not None:
            out, found = self._shipped(items), []
        else:
            self.reexecuted += 1
            inputs = self.inner.inputs(items)
            again = copy_of(self.state, inputs, self._sweep(len(items)))
            out = self.inner.run(items)
            found = again.run(inputs, out, self.state)
        corrupt = self.state.backend.corrupt
        if corrupt or found:
            found = corrupt + found
            self.state.backend.corrupt = []
            ts = [item[0][:4] for item in items]
            before = min((f.since for f in corrupt), default=None)
            self.on_mismatch(SilentCorruption(CorruptionRecord(self.name, self.instance, (min(ts), max(ts)), found, self.watermark, before)))
        return out

    def _shipped(self, items: list) -> list:
        """Run ``items`` and ship them to the verifier with what their re-run reads (unless
        the link is full: then they run unchecked, counted)."""
        link = self.link
        if link.full():
            link.dropped += 1
            return self.inner.run(items)
        self.reexecuted += 1
        state, inputs = self.state, self.inner.inputs(items)
        shipment = ship(state, self.step_id, inputs, self._sweep(len(items)))
        out = self.inner.run(items)
        shipment.add_settled(state, None if self.arrivals is None else self._reads(shipment.keys))
        shipment.add_live(state, out)
        link.submit(shipment, shipment.expected(), self.name, self.instance, self.watermark)
        return out

    def _arrived(self, items: list) -> None:
        """Note each element's key, time and batch (the backend's reads go with the batch number)."""
        self.state.backend.seq = batch = self.batches
        arrivals = self.arrivals
        for meta, _, key in items:
            queue = arrivals.get(key)
            if queue is None:
                queue = arrivals[key] = deque()
            queue.append((meta[:4], batch))

    def _reads(self, keys: list) -> dict:
        """Per key of ``keys``, the entries its log's entries read or saw folded: those read or
        folded since the earliest arrival among its elements not folded yet (each was last applied
        since it arrived), the older ones forgotten. O(the keys' entries tracked)."""
        backend, arrivals, watermark, out = self.state.backend, self.arrivals, self.watermark, {}
        for key in keys:
            queue = arrivals.get(key)
            while queue and queue[0][0] < watermark:
                queue.popleft()  # folded: its reads are settled history
            if queue:
                out[key] = backend.read_since(key, queue[0][1])
        return out

    def _sweep(self, entries: int) -> list:
        """Keys whose logs the re-run checks too, about ``entries`` of their entries, in turn over
        every key with a log: a state that went bad in a log nothing re-runs is found within
        (entries in the logs / a batch's) re-runs, unless the watermark folds it first."""
        logs, keys = self.state.logs, []
        while entries > 0:
            if not self.pending:
                self.pending = list(logs)
                if not self.pending:
                    break
            key = self.pending.pop()
            log = logs.get(key)
            if log is not None:
                keys.append(key)
                entries -= len(log.metas)
            elif not logs:
                break
        return keys

    def settle(self, watermark: tuple) -> None:
        self.watermark = self.state.backend.at = watermark
        self.inner.settle(watermark)
        if self.arrivals is not None:  # the keys whose logs the watermark emptied start afresh
            logs = self.state.logs
            self.state.backend.forget(logs)
            for key in [key for key in self.arrivals if key not in logs]:
                del self.arrivals[key]


def set_aside_since(store: Any, before: Optional[tuple], reason: str) -> list:
    """Take out of use every committed snapshot of ``store`` whose time is not below ``before``
    (taken after a value went bad, it may hold it; None: none); their ids. The next restore
    then takes the newest left (none: the beginning), as after a damaged file
    (``SnapshotStore.quarantine``)."""
    if before is None:
        return []
    gone = []
    for sid in reversed(store.committed_ids()):
        data = store.read_manifest(sid)
        if data is not None and tuple(Manifest.from_json(data).t) < before:
            break
        store.quarantine(sid, reason)
        gone.append(sid)
    return gone


def reexecuted(rt: Any, every: int, seed: int, on_mismatch: Callable[[SilentCorruption], None], restored: Optional[tuple] = None,
               link: Any = None) -> list:
    """Wrap the keyed steps (``stateful_map``, ``stateful_flat_map``, lookups) of stage runtime
    ``rt`` in :class:`ReexecutedStep`; the wrapped ones. The first batch re-run is seeded per
    instance (``seed``), then every ``every``-th. ``restored``: the time of the snapshot its
    state was restored from (what it reads from there was right then). ``link``: re-run on the
    verifier (see :class:`ReexecutedStep`). Windows are not covered yet."""
    done = []
    for sid, op in list(rt.operators.items()):
        if isinstance(op, Keyed):
            rt.operators[sid] = wrapped = ReexecutedStep(op, every, seed + sid, f"{rt.key[0]}/{rt.key[1]}", on_mismatch, link, sid)
            wrapped.state.backend.at = restored or ()
            done.append(wrapped)
    return done


__all__ = ["CorruptionRecord", "Mismatch", "ReexecutedStep", "SilentCorruption", "reexecuted", "set_aside_since"]
