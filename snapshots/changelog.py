"""A participant's state in a snapshot: a base checkpoint plus the deltas written since.

Taking a RocksDB checkpoint and uploading it costs a memtable flush, file
syncs (with the interpreter lock held, in rocksdict) and a copy of every table
file; at a 50 ms snapshot interval that was most of exactly-once's latency cost.
So most snapshots write only a *delta*, one small file of what changed since
the previous snapshot. Every ``base_every_s`` seconds (or ``max_deltas``
deltas) a snapshot writes a new *base* instead: a full RocksDB checkpoint.
Restoring snapshot ``s`` opens its base and applies its deltas in order. Flink's
changelog state backend makes the same trade.

A delta records a changed key by the *inputs* folded into it since the last
snapshot when it can, and by its whole state otherwise. A frequent word's
posting list holds thousands of pages but gains one or two per snapshot
interval: re-encoding the state twenty times a second was the cost of
exactly-once at 50 ms snapshots. Restoring re-applies the inputs with the
step's function, which the engine already requires to be deterministic (a late
element makes it re-apply them too). A key falls back to its state when its
inputs are many (``MAX_INPUTS``: the state is then the smaller record) or the
codec cannot encode them.

>>> chain = Chain(base_every_s=5.0, max_deltas=100)
>>> chain.needs_base(now=0.0)                 # nothing to build on yet
True
>>> chain.add_base(1, now=0.0); chain.needs_base(now=1.0)
False
>>> chain.add_delta(2); chain.add_delta(3); chain.entry("count-0")
{'participant': 'count-0', 'base': 1, 'deltas': [2, 3]}
>>> chain.needs_base(now=5.0)
True
>>> keys = StateKeys()
>>> rows = decode_delta(encode_delta({"n": (3, [1, 2]), "s": ("ab", None)}, keys))
>>> [(keys.decode(k), kind) for k, kind, _ in rows]
[('n', 'inputs'), ('s', 'state')]
>>> add = lambda state, x: ((state or 0) + x, None)
>>> replay_deltas([rows], lambda key: None, add) == {keys.encode("n"): 3, keys.encode("s"): "ab"}
True

A row is keyed by the stored key (:class:`~.state_keys.StateKeys`: key group, then the
encoded key), so the rows of a range of key groups are found without decoding any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import msgpack

from driftstream.ordering.key_groups import GroupRange

from .codec import decode, encode
from .state_keys import StateKeys


class _Removed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REMOVED"


#: Written in place of a state: the key has none any more (its record is deleted; a
#: delta row of kind "removed").
REMOVED = _Removed()

#: File name of a delta inside a participant's directory of a snapshot.
DELTA_FILE = "DELTA"

_DELTA_VERSION = 4
#: Older delta formats this build still reads (2: without removed keys; 2 and 3: rows keyed
#: without their key group, see :func:`delta_rows`).
_READABLE = (2, 3, 4)
_LEGACY_KEYS = (2, 3)

#: A key with more folded inputs than this is recorded by its state.
MAX_INPUTS = 256

_STATE, _INPUTS, _REMOVED = 0, 1, 2
_KINDS = {_STATE: "state", _INPUTS: "inputs", _REMOVED: "removed"}


class DeltaError(ValueError):
    """A delta file that was not written by :func:`encode_delta` (or is damaged)."""


@dataclass
class Chain:
    """Which snapshots hold one participant's state: the newest base and the deltas after it.

    The cost of restoring grows with the deltas since the base; the cost of a
    snapshot with whether it writes a base. ``needs_base`` balances the two.
    """

    base_every_s: float = 5.0
    max_deltas: int = 100
    base: Optional[int] = None
    deltas: list = field(default_factory=list)
    base_at: float = 0.0

    def needs_base(self, now: float) -> bool:
        """True when the next snapshot should write a full checkpoint. O(1)."""
        return self.base is None or len(self.deltas) >= self.max_deltas or now - self.base_at >= self.base_every_s

    def add_base(self, snapshot_id: int, now: float) -> None:
        """Snapshot ``snapshot_id`` wrote a full checkpoint: earlier deltas are no longer needed."""
        self.base, self.deltas, self.base_at = snapshot_id, [], now

    def add_delta(self, snapshot_id: int) -> None:
        """Snapshot ``snapshot_id`` wrote a delta on top of the chain."""
        self.deltas.append(snapshot_id)

    def reset(self) -> None:
        """A snapshot of this chain failed to write: the next one must be a base."""
        self.base, self.deltas = None, []

    def entry(self, participant: str) -> dict:
        """The manifest's record of this participant (JSON-ready)."""
        return {"participant": participant, "base": self.base, "deltas": list(self.deltas)}

    @classmethod
    def from_entry(cls, entry: dict, now: float, base_every_s: float = 5.0, max_deltas: int = 100) -> "Chain":
        """The chain a restored participant goes on from (its files stay in the store)."""
        return cls(base_every_s, max_deltas, entry["base"], list(entry["deltas"]), now)


def snapshots_required(entry: dict) -> list:
    """Every snapshot whose files a manifest entry reads: its base and its deltas."""
    return [entry["base"], *entry["deltas"]]


def encode_delta(changes: dict, keys: StateKeys) -> bytes:
    """A delta file of ``{key: (state, inputs)}``: each key by the inputs folded into it since
    the last snapshot (``inputs`` a list; None when unknown) or by its state. O(encoded size)."""
    return pack_delta([delta_row(keys.encode(key), state, inputs) for key, (state, inputs) in changes.items()])


def delta_row(k: bytes, state: Any, inputs: Optional[list]) -> list:
    """The row of a delta (:func:`pack_delta` makes the file) of the key stored as ``k``
    (:meth:`StateKeys.encode`): ~4 us for a key with one small input tuple. Lets a writer
    encode a large delta a few rows at a time."""
    if state is REMOVED:
        return [k, _REMOVED, b""]
    if inputs is not None and len(inputs) <= MAX_INPUTS:
        try:
            return [k, _INPUTS, encode(inputs)]
        except (TypeError, ValueError):
            pass  # inputs the codec cannot take: the state (which it must) goes instead
    return [k, _STATE, encode(state)]


def pack_delta(rows: list) -> bytes:
    """The delta file of ``rows`` (from :func:`delta_row`). O(bytes), in C."""
    return msgpack.packb([_DELTA_VERSION, rows], use_bin_type=True)


def decode_delta(data: bytes) -> list:
    """The rows of a delta file, ``(key bytes, "state" | "inputs" | "removed", encoded value)``; DeltaError
    if it is not one. O(bytes); the values stay encoded.

    >>> decode_delta(b"junk")
    Traceback (most recent call last):
    ...
    driftstream.snapshots.changelog.DeltaError: not a delta file: ExtraData(106, b'unk')
    """
    return _decode(data)[1]


def delta_rows(data: bytes, keys: StateKeys, groups: Optional[GroupRange] = None) -> list:
    """The rows of a delta file keyed by stored keys (a file from before key groups gets
    its keys' groups from ``keys``), only those of ``groups`` if given. O(rows).

    >>> keys = StateKeys()
    >>> data = encode_delta({"a": (1, None), "b": (2, None)}, keys)
    >>> [keys.decode(k) for k, _, _ in delta_rows(data, keys, GroupRange(keys.group_of("a"), keys.group_of("a") + 1))]
    ['a']
    """
    version, rows = _decode(data)
    if version in _LEGACY_KEYS:
        rows = [(keys.from_legacy(k), kind, v) for k, kind, v in rows]
    if groups is None:
        return rows
    first, end = StateKeys.bounds(groups)
    return [row for row in rows if first <= row[0] < end]


def _decode(data: bytes) -> tuple:
    try:
        version, rows = msgpack.unpackb(data, raw=True, use_list=True, strict_map_key=True)
        if version not in _READABLE:
            raise DeltaError(f"delta format {version!r}, this build reads {', '.join(map(str, _READABLE))}")
        out = [(k, _KINDS[kind], v) for k, kind, v in rows]
    except DeltaError:
        raise
    except Exception as exc:
        raise DeltaError(f"not a delta file: {exc!r}") from exc
    if not all(type(k) is bytes and type(v) is bytes for k, _, v in out):
        raise DeltaError("not a delta file: its rows are not bytes")
    return version, out


def replay_deltas(deltas: list, base_state: Callable[[bytes], Any], fn: Callable[[Any, Any], tuple]) -> dict:
    """The states of the keys the ``deltas`` (each a list of :func:`decode_delta` rows, oldest
    first) changed, as ``{key bytes: state}`` (:data:`REMOVED` for a key removed since). ``base_state(key bytes)`` is a key's state in the
    base (None if it has none); ``fn(state, input) -> (state, output)`` is the step's function.
    O(rows + inputs re-applied); each base state is read once."""
    states: dict = {}
    for rows in deltas:
        for key, kind, value in rows:
            if kind == "state":
                states[key] = decode(value)
                continue
            if kind == "removed":
                states[key] = REMOVED
                continue
            state = states[key] if key in states else base_state(key)
            if state is REMOVED:
                state = None
            for element in decode(value):
                state = fn(state, element)[0]
            states[key] = state
    return states
