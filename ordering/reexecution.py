"""Re-running one batch of a keyed state on a copy and comparing (issue 58, ``verify="reexecute:N"``,
as Orthrus does for silent CPU errors): determinism makes the comparison exact.

:func:`copy_of` takes, before the live state applies a batch, a fresh state of the same class
over the same (read-only while a batch applies) settled backend, holding the logs of the keys
the batch touches with every entry *not applied*: :meth:`Reexecution.run` first re-applies each
of those logs from the key's settled value (so a log entry's state that went bad since it was
computed, or was computed wrong, shows as a changed output), then the batch. A key's post-state
(:func:`key_parts`: its log's times, payloads, outputs, states or journals, and an entry
state's overlay of the key) must be the live state's, and so must the outputs.

>>> from driftstream.ordering.keyed_state import DriftingKeyedState
>>> from driftstream.ordering.meta import Meta
>>> live = DriftingKeyedState(lambda s, x: ((s or 0) + x, (s or 0) + x))
>>> _ = live.apply(Meta(1, 0, 0, 1), 5, "k")
>>> batch = [(Meta(2, 0, 0, 2), 1, "k")]
>>> again = copy_of(live, batch)
>>> out = live.apply_items(batch)
>>> again.run(batch, out, live)
[]
>>> live.logs["k"].after[-1] = 4        # the state after t=2 goes bad: the next element reads it
>>> again = copy_of(live, batch := [(Meta(3, 0, 0, 3), 1, "k")])
>>> [m.kind for m in again.run(batch, live.apply_items(batch), live)]
['output', 'state']

Costs, for the batches re-run only: one call of the function per entry of each touched key's log
and per element of the batch, and a comparison of each touched key's post-state.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Optional

from .entry_state import EntryKeyedState
from .keyed_state import KeyLog


@dataclass
class Mismatch:
    """What a re-run found different: ``kind`` is ``"log"`` (the touched keys' logs re-applied
    from their settled values gave other outputs than the live ones hold), ``"output"`` (the
    batch's outputs) or ``"state"`` (``key``'s state after the batch); the live and the copy's
    digests."""

    kind: str
    key: Optional[Hashable]
    live: int
    copy: int


def _crc(value: Any) -> int:
    return zlib.crc32(repr(value).encode())


def key_parts(state: Any, key: Hashable) -> list:
    """``key``'s part of ``state`` above its settled value: its pending tombstones and its log
    (times, payloads, outputs, and each entry's state, or journal and the overlay of the records
    the journals wrote)."""
    log = state.logs.get(key)
    parts: list = [state.pending_tombstones.get(key)]
    if log is not None:
        parts += [log.metas, log.payloads, log.outputs, log.after]
        if isinstance(state, EntryKeyedState):
            overlay = state.overlay
            records = sorted({entry for journal in log.after if journal for entry in journal}, key=repr)
            parts.append([(entry, overlay.get((key, entry))) for entry in records])
    return parts


def key_digest(state: Any, key: Hashable) -> int:
    """The digest of :func:`key_parts` (what a record of a difference shows)."""
    return _crc(key_parts(state, key))


class Reexecution:
    """A copy of a keyed state's touched keys, ready to re-run one batch (see :func:`copy_of`)."""

    def __init__(self, copy: Any, keys: list) -> None:
        self.copy, self.keys = copy, keys

    def run(self, items: list, live_out: list, live: Any) -> list:
        """Re-apply the touched keys' logs, then ``items``; the :class:`Mismatch` es against the
        live state (which has applied ``items`` and given ``live_out``). Empty: they agree."""
        copy, found = self.copy, []
        replayed = reapply_logs(copy, self.keys)
        if replayed:
            found.append(Mismatch("log", None, 0, _crc(replayed)))
        copy_out = copy.apply_items(items)
        if copy_out != live_out:
            found.append(Mismatch("output", None, _crc(live_out), _crc(copy_out)))
        for key in self.keys:  # compared as values (a repr of big states costs more), digested when they differ
            if key_parts(live, key) != key_parts(copy, key):
                found.append(Mismatch("state", key, key_digest(live, key), key_digest(copy, key)))
        return found


def copy_of(state: Any, items: list, also: Iterable[Hashable] = ()) -> Reexecution:
    """Before ``state`` applies ``items`` (``(meta, payload, key)``): a fresh state of its class
    over the same settled backend (checked, if it is: the copy's reads of the touched keys'
    settled state are checked too), holding the logs of the keys ``items`` touch and of the keys
    ``also`` (checked as well, though the batch has nothing for them), their entries not
    applied. O(those keys' logs)."""
    copy = type(state)(state.fn, flat=state.flat, backend=state.backend, on_error=state.on_error)
    keys = list(dict.fromkeys([*(item[2] for item in items), *also]))
    logs, pending = state.logs, state.pending_tombstones
    copy_logs(copy, ((key, (log.metas, log.payloads, log.outputs)) for key in keys if (log := logs.get(key)) is not None),
              {key: pending[key] for key in keys if pending.get(key)}, state.diverted)
    return Reexecution(copy, keys)


def copy_logs(copy: Any, logs: Iterable[tuple], pending: dict, diverted: set) -> None:
    """Give the fresh state ``copy`` the logs ``(key, (metas, payloads, outputs))``, their
    entries not applied, the ``pending`` tombstones (key -> list) and the ``diverted`` metas
    (copies of each: the live state goes on changing its own)."""
    for key, (metas, payloads, outputs) in logs:
        mine = KeyLog()
        mine.metas, mine.payloads, mine.outputs = list(metas), list(payloads), list(outputs)
        mine.after = [None] * len(mine.metas)
        copy.logs[key] = mine
        copy._size += len(mine.metas)
    for key, tombstones in pending.items():
        copy.pending_tombstones[key] = list(tombstones)
    if diverted:
        copy.diverted = set(diverted)


def reapply_logs(copy: Any, keys: Iterable[Hashable]) -> list:
    """Re-apply each of ``keys``' logs in ``copy`` from its settled value; the outputs that
    came out different from those the logs hold (empty: the same)."""
    replayed: list = []
    for key in keys:
        log = copy.logs.get(key)
        if log is not None and log.metas:
            copy._replay(key, log, 0, replayed)
    return replayed
