"""A re-run of one keyed batch in another process (issue 58, ``verify="reexecute:N"`` with a
verifier, as Orthrus validates on other cores): a bad core repeats its error when the check runs
on it, so the batch, the touched keys' logs and the settled records the re-run reads are shipped
(:class:`Shipment`) with what the live run gave (its outputs and the keys' post-state), re-run
there from a fresh state and compared (:func:`rerun`): the :class:`Verdict` lists the
differences, each with the canonical digests of both sides (:func:`canonical_digest`).

>>> from driftstream.ordering.keyed_state import DriftingKeyedState
>>> from driftstream.ordering.meta import Meta
>>> def add(s, x): return (s or 0) + x, (s or 0) + x
>>> live = DriftingKeyedState(add)
>>> _ = live.apply(Meta(1, 0, 0, 1), 5, "k")
>>> batch = [(Meta(2, 0, 0, 2), 1, "k")]
>>> shipment = ship(live, 0, batch)
>>> out = live.apply_items(batch)
>>> shipment.add_settled(live); shipment.add_live(live, out)
>>> rerun(shipment, lambda backend: DriftingKeyedState(add, backend=backend)).found
[]
>>> live.logs["k"].after[-1] = 4               # the live state went wrong as the batch ran
>>> shipment.add_live(live, out)
>>> [m.kind for m in rerun(shipment, lambda backend: DriftingKeyedState(add, backend=backend)).found]
['state']

Compared as values in the verifier (``==`` does not care for a set's or a dict's order, which
follows the process's string hashes), digested only where they differ: a canonical digest of a
big state costs ~12x its pickle. Costs, per batch shipped: a copy of the touched keys' logs, a
read of the settled records they and the batch read, the pickle of all that and of the live
outputs and post-state; nothing for the batches not shipped.
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
    records with no value); and what the live run gave (:meth:`add_live`)."""

    step: int
    entries: bool
    items: list
    keys: list
    logs: dict
    pending: dict
    diverted: list
    settled: dict = field(default_factory=dict)
    absent: list = field(default_factory=list)
    live_out: list = field(default_factory=list)
    live_states: dict = field(default_factory=dict)

    def least_t(self) -> tuple:
        """The least time of what the re-run applies (a batch item or a log entry): a snapshot
        taken at or after it may hold what the re-run checks."""
        times = [item[0][:4] for item in self.items] + [metas[0][:4] for metas, _, _ in self.logs.values() if metas]
        return min(times)

    def add_live(self, state: Any, out: list) -> None:
        """What the live ``state`` gave: the batch's outputs ``out`` and each key's post-state
        (:func:`~.reexecution.key_parts`; referenced, not copied: pickled as it is shipped)."""
        self.live_out = out
        self.live_states = {key: key_parts(state, key) for key in self.keys}

    def expected(self) -> "Expected":
        """What the instance keeps while the verdict is out."""
        ts = [item[0][:4] for item in self.items]
        return Expected((min(ts), max(ts)), self.least_t())

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
    """What a re-run found: the :class:`~.reexecution.Mismatch` es (empty: it agrees)."""

    found: list = field(default_factory=list)


@dataclass
class Expected:
    """What the instance keeps of a shipped batch: its t range, and the least time re-run
    (:meth:`Shipment.least_t`): a snapshot at or after it may hold what the re-run checks."""

    t_range: tuple
    least_t: tuple


def rerun(shipment: Shipment, make_state: Callable[[Any], Any]) -> Verdict:
    """Re-run ``shipment`` on a fresh state (``make_state(backend)``: the step's state class and
    function over the shipped settled records): its logs re-applied, then its batch, compared
    with the live side. A record the re-run read unshipped is a ``"read"`` difference: the
    live run never read it, so the two computations went different ways."""
    backend = ShippedEntries(shipment.settled, shipment.absent) if shipment.entries else DictBackend()
    if not shipment.entries:
        for key, value in shipment.settled.items():
            backend.put(key, value)
    copy = make_state(backend)
    copy_logs(copy, shipment.logs.items(), shipment.pending, set(shipment.diverted))
    found = []
    replayed = reapply_logs(copy, shipment.keys)
    if replayed:
        found.append(Mismatch("log", None, 0, canonical_digest(replayed)))
    out = copy.apply_items(shipment.items)
    if out != shipment.live_out:
        found.append(Mismatch("output", None, canonical_digest(shipment.live_out), canonical_digest(out)))
    for key in shipment.keys:
        mine, live = key_parts(copy, key), shipment.live_states.get(key)
        if mine != live:
            found.append(Mismatch("state", key, canonical_digest(live), canonical_digest(mine)))
    found += [Mismatch("read", record, 0, 0) for record in getattr(backend, "unshipped", ())]
    return Verdict(found)


__all__ = ["Expected", "Shipment", "ShippedEntries", "Verdict", "canonical_digest", "rerun", "ship"]
