"""A re-run of one keyed batch in another process (issue 58, ``verify="reexecute:N"`` with a
verifier, as Orthrus validates on other cores): a bad core repeats its error when the check runs
on it, so the batch, the touched keys' logs and the settled records the re-run reads are shipped
(:class:`Shipment`), re-run there from a fresh state (:func:`rerun`), and the instance compares
the digests that come back (:class:`Verdict`) with its own (:class:`Expected`, :func:`compare`).

>>> from driftstream.ordering.keyed_state import DriftingKeyedState
>>> from driftstream.ordering.meta import Meta
>>> def add(s, x): return (s or 0) + x, (s or 0) + x
>>> live = DriftingKeyedState(add)
>>> _ = live.apply(Meta(1, 0, 0, 1), 5, "k")
>>> batch = [(Meta(2, 0, 0, 2), 1, "k")]
>>> shipment = ship(live, 0, batch)
>>> out = live.apply_items(batch)
>>> shipment.add_settled(live)
>>> expected = expected_of(live, shipment, out)
>>> verdict = rerun(shipment, lambda backend: DriftingKeyedState(add, backend=backend))
>>> compare(expected, verdict)
[]
>>> live.logs["k"].after[-1] = 4               # the live state went wrong after the batch ran
>>> [m.kind for m in compare(expected_of(live, shipment, out), verdict)]
['state']

Determinism makes the digests exact across processes, given a canonical encoding
(:func:`canonical_digest`: a set's or a dict's order is not its value's). Costs, per batch
shipped: a copy of the touched keys' logs, a read of the settled records they and the batch
read, the pickle of all that, and in each process a digest of the outputs and of the touched
keys' post-state; nothing for the batches not shipped.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

from .entry_state import DELETED, SIZE, DictEntryBackend, EntryKeyedState
from .keyed_state import DictBackend
from .reexecution import Mismatch, copy_logs, key_parts, reapply_logs


def _canonical(value: Any) -> str:
    """An encoding equal in any process for equal plain data: sets and dicts sorted (their
    iteration order follows the process's string hashes), objects by their class and fields."""
    kind = type(value)
    if kind in (str, int, float, bool, bytes) or value is None:
        return repr(value)
    if isinstance(value, (tuple, list)):
        return f"{kind.__name__}({','.join(map(_canonical, value))})"
    if isinstance(value, dict):
        return "{" + ",".join(sorted(f"{_canonical(k)}:{_canonical(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ",".join(sorted(map(_canonical, value))) + "}"
    fields = getattr(value, "__dict__", None)
    if fields is not None and kind.__repr__ is object.__repr__:  # a default repr holds the object's address
        return f"{kind.__qualname__}{_canonical(fields)}"
    return repr(value)


def canonical_digest(value: Any) -> int:
    """CRC-32 of :func:`_canonical`: the same for equal values in any process.

    >>> canonical_digest({"b", "a"}) == canonical_digest({"a", "b"}) != canonical_digest({"a"})
    True
    """
    return zlib.crc32(_canonical(value).encode())


class ShippedEntries(DictEntryBackend):
    """An entry state's settled records as shipped: a read of a record that was not shipped
    (the re-run read what the live run never did: its computation went another way) is
    recorded in ``unshipped`` and reads as missing."""

    def __init__(self, records: dict, absent: Iterable[tuple]) -> None:
        super().__init__()
        self._data.update(records)
        self.absent = set(absent)
        self.unshipped: list = []

    def get(self, record: tuple) -> Any:
        value = self._data.get(record, DELETED)
        if value is DELETED and record not in self.absent:
            self.unshipped.append(record)
            self.absent.add(record)
        return value


@dataclass
class Shipment:
    """One batch of keyed step ``step`` to re-run elsewhere: its ``items`` (``(meta, payload,
    key)``), the ``logs`` of the keys it touches and the swept ones (``key -> (metas, payloads,
    outputs)``, as before the batch), their ``pending`` tombstones, the ``diverted`` metas among
    them, and the settled state the re-run reads (:meth:`add_settled`): ``settled`` (a value
    state's per key; an entry state's per ``(key, entry)``) and ``absent`` (an entry state's
    records with no value)."""

    step: int
    entries: bool
    items: list
    keys: list
    logs: dict
    pending: dict
    diverted: list
    settled: dict = field(default_factory=dict)
    absent: list = field(default_factory=list)

    def least_t(self) -> tuple:
        """The least time of what the re-run applies (a batch item or a log entry): a snapshot
        taken at or after it may hold what the re-run checks."""
        times = [item[0][:4] for item in self.items] + [metas[0][:4] for metas, _, _ in self.logs.values() if metas]
        return min(times)

    def add_settled(self, state: Any, read: Optional[dict] = None) -> None:
        """Take the settled records the re-run reads from ``state``'s backend (unchecked: the
        live reads were checked): a value state's per key; an entry state's, the records its
        logs' journals wrote, its size, and ``read[key]`` (the entries the engine read or
        folded for the key since its log's entries were applied, see ``CheckedEntries.read_since``)."""
        backend = getattr(state.backend, "inner", state.backend)
        if not self.entries:
            self.settled = {key: backend.get(key) for key in self.keys}
            return
        read = read or {}
        for key in self.keys:
            log = state.logs.get(key)
            wanted = {SIZE, *read.get(key, ())}
            if log is not None:
                wanted.update(entry for journal in log.after if journal for entry in journal)
            for entry in wanted:
                value = backend.get((key, entry))
                if value is DELETED:
                    self.absent.append((key, entry))
                else:
                    self.settled[(key, entry)] = value


def ship(state: Any, step: int, items: list, also: Iterable[Hashable] = ()) -> Shipment:
    """Before ``state`` applies ``items``: what a re-run elsewhere needs but the settled
    records (:meth:`Shipment.add_settled`, once the batch ran). O(the keys' logs)."""
    keys = list(dict.fromkeys([*(item[2] for item in items), *also]))
    logs, pending = state.logs, state.pending_tombstones
    shipped = {key: (list(log.metas), list(log.payloads), list(log.outputs)) for key in keys if (log := logs.get(key)) is not None}
    diverted = [m for metas, _, _ in shipped.values() for m in metas if m in state.diverted] if state.diverted else []
    return Shipment(step, isinstance(state, EntryKeyedState), list(items), keys, shipped,
                    {key: list(pending[key]) for key in keys if pending.get(key)}, diverted)


@dataclass
class Verdict:
    """What a re-run gave: the digest of the outputs its re-applied logs changed (None: none),
    of the batch's outputs, of each key's post-state (:func:`~.reexecution.key_parts`), and the
    records it read that were not shipped."""

    log: Optional[int]
    output: int
    states: dict
    unshipped: list = field(default_factory=list)


@dataclass
class Expected:
    """The live side of a shipped batch: its outputs' and its keys' post-state digests, the
    batch's t range, and the least time re-run (:meth:`Shipment.least_t`)."""

    output: int
    states: dict
    t_range: tuple
    least_t: tuple


def expected_of(state: Any, shipment: Shipment, live_out: list) -> Expected:
    """The live state's digests after it applied ``shipment``'s batch and gave ``live_out``."""
    ts = [item[0][:4] for item in shipment.items]
    return Expected(canonical_digest(live_out), {key: canonical_digest(key_parts(state, key)) for key in shipment.keys},
                    (min(ts), max(ts)), shipment.least_t())


def rerun(shipment: Shipment, make_state: Callable[[Any], Any]) -> Verdict:
    """Re-run ``shipment`` on a fresh state (``make_state(backend)``: the step's state class and
    function over the shipped settled records): its logs re-applied, then its batch."""
    backend = ShippedEntries(shipment.settled, shipment.absent) if shipment.entries else DictBackend()
    if not shipment.entries:
        for key, value in shipment.settled.items():
            backend.put(key, value)
    copy = make_state(backend)
    copy_logs(copy, shipment.logs.items(), shipment.pending, set(shipment.diverted))
    replayed = reapply_logs(copy, shipment.keys)
    out = copy.apply_items(shipment.items)
    return Verdict(None if not replayed else canonical_digest(replayed), canonical_digest(out),
                   {key: canonical_digest(key_parts(copy, key)) for key in shipment.keys},
                   list(getattr(backend, "unshipped", ())))


def compare(expected: Expected, verdict: Verdict) -> list:
    """The :class:`~.reexecution.Mismatch` es between the live side and a re-run (empty: they
    agree). A record the re-run read unshipped is a ``"read"`` difference: the live run never
    read it, so the two computations went different ways."""
    found = []
    if verdict.log is not None:
        found.append(Mismatch("log", None, 0, verdict.log))
    if verdict.output != expected.output:
        found.append(Mismatch("output", None, expected.output, verdict.output))
    for key, live in expected.states.items():
        if verdict.states.get(key) != live:
            found.append(Mismatch("state", key, live, verdict.states.get(key, 0)))
    for record in verdict.unshipped:
        found.append(Mismatch("read", record, 0, 0))
    return found


__all__ = ["Expected", "Shipment", "ShippedEntries", "Verdict", "canonical_digest", "compare", "expected_of", "rerun", "ship"]
