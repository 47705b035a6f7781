"""Digests of settled keyed state as the engine wrote it, checked when it is read back (issue 58,
``verify="reexecute:N"``).

Re-running a batch from the state it read cannot see a value that went bad *in* that state
between two batches (a flipped bit in memory): the copy starts from the same bad value and
agrees. So every settled record (a value state's key, an entry state's ``(key, entry)``) gets a
digest when the engine writes it (a fold), and every read of it checks the value against that
digest: a flip of a settled value is caught at its first read, before any output is derived
from it. A record restored from a snapshot (or otherwise not written by this state) gets its digest at its first read
(the snapshot's own checksums cover the store; memory after the restore is covered from that
read on). Each digest is kept with ``at``, the watermark when it was taken: the value was right
then, so a snapshot taken before that watermark holds it right (:class:`CorruptRead` ``since``).

>>> from driftstream.ordering.keyed_state import DictBackend
>>> checked = CheckedValues(DictBackend())
>>> checked.at = (7,); checked.fold("k", 3, [1, 2]); checked.get("k"), checked.corrupt
(3, [])
>>> checked.inner.put("k", 2)          # a flip behind the engine's back
>>> checked.get("k"), checked.corrupt[0].key, checked.corrupt[0].since
(2, 'k', (7,))

Costs, only with ``verify="reexecute:N"``: a :func:`digest` of the value per record written and
per record read from the backend (reads of a key's own log cost nothing).
"""

from __future__ import annotations

import marshal
import zlib
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Optional


def digest(value: Any) -> int:
    """The digest of a state value: CRC-32 of its ``marshal`` format 0 (plain data: 0.13 us for a
    short list against 0.48 through ``repr``, 6.5 against 46 for a dict of 200 lists; format 0
    marks neither shared objects nor interned strings, so a value decoded from the store
    digests as the one written), else of its ``repr``. Compared in the process that wrote it.

    >>> digest((1, "a")) == digest((1, "a")) != digest((1, "b")), digest(object) == digest(object)
    (True, True)
    """
    try:
        return zlib.crc32(marshal.dumps(value, 0))
    except ValueError:  # not plain data (an object of the user's class)
        return zlib.crc32(repr(value).encode())


@dataclass
class CorruptRead:
    """A settled record whose value read back differs from what the engine wrote: its digest
    when written (or first read) and now, and the watermark ``since`` when the first was taken."""

    key: Hashable
    written: int
    read: int
    since: tuple


class CheckedBackend:
    """What both checked backends share: ``inner`` (the real backend), the digests of what was
    written, and ``corrupt`` (the reads that did not match, in order; the operator looks after
    each batch: a raise here would surface inside the user's function). ``at``: the watermark
    now (its owner sets it before each fold)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.written: dict = {}  # record -> (digest, the watermark when taken)
        self.corrupt: list = []
        self.at: tuple = ()

    def _check(self, record: Hashable, value: Any) -> Any:
        expected = self.written.get(record)
        found = digest(value)
        if expected is None:
            self.written[record] = (found, self.at)
        elif found != expected[0]:
            self.corrupt.append(CorruptRead(record, expected[0], found, expected[1]))
        return value

    def items(self) -> Iterable[tuple]:
        return self.inner.items()


class CheckedValues(CheckedBackend):
    """A value state's backend (:class:`~.keyed_state.StateBackend`) whose folds are digested
    and whose reads are checked. It offers no ``read_view``: every read goes through :meth:`get`."""

    def get(self, key: Hashable) -> Any:
        return self._check(key, self.inner.get(key))

    def put(self, key: Hashable, state: Any) -> None:
        self.written[key] = (digest(state), self.at)
        self.inner.put(key, state)

    def fold(self, key: Hashable, state: Any, inputs: list) -> None:
        self.written[key] = (digest(state), self.at)
        self.inner.fold(key, state, inputs)

    def remove(self, key: Hashable) -> None:
        self.written.pop(key, None)
        self.inner.remove(key)

    def remove_many(self, keys: Iterable[Hashable]) -> None:
        keys = list(keys)
        for key in keys:
            self.written.pop(key, None)
        self.inner.remove_many(keys)


class CheckedEntries(CheckedBackend):
    """An entry state's backend (:class:`~.entry_state.EntryBackend`) whose folded writes are
    digested and whose reads are checked (no ``read_view``: the in-order path reads through
    :meth:`get`). ``read`` (after :meth:`track`): per key, the entries read or folded since the
    key's log was last empty (:meth:`forget`), each with ``seq`` then (its owner's batch number),
    which a re-run of its log in another process reads (a log entry read from the overlay what a
    fold has since moved here)."""

    read: Optional[dict] = None
    seq: int = 0

    def get(self, record: tuple) -> Any:
        if self.read is not None:
            self.read.setdefault(record[0], {})[record[1]] = self.seq
        return self._check(record, self.inner.get(record))

    def fold(self, writes: list) -> None:
        written, at, read, seq = self.written, self.at, self.read, self.seq
        for record, value in writes:
            written[record] = (digest(value), at)
            if read is not None:
                read.setdefault(record[0], {})[record[1]] = seq
        self.inner.fold(writes)

    def track(self) -> None:
        """From now on, keep :attr:`read`."""
        self.read = {}

    def read_since(self, key: Hashable, since: int) -> dict:
        """The entries of ``key`` read or folded at ``seq`` >= ``since`` (the older ones are
        forgotten: what the key's log now holds was applied since). O(the key's entries tracked)."""
        entries = self.read.get(key) if self.read else None
        if not entries:
            return {}
        kept = self.read[key] = {entry: seq for entry, seq in entries.items() if seq >= since}
        return kept

    def forget(self, logs: dict) -> None:
        """Drop :attr:`read` of the keys with no log in ``logs`` (after a fold). O(keys tracked)."""
        read = self.read
        if read:
            for key in [key for key in read if key not in logs]:
                del read[key]

    def entries(self, key: Hashable) -> Iterable[tuple]:
        return self.inner.entries(key)
