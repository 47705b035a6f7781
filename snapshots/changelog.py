"""A participant's state in a snapshot: a base checkpoint plus the deltas written since.

Taking a RocksDB checkpoint and uploading it costs a memtable flush, file
syncs (with the interpreter lock held, in rocksdict) and a copy of every table
file; at a 50 ms snapshot interval that was most of exactly-once's latency cost.
So most snapshots write only a *delta*: the encoded states that changed since
the previous snapshot, one small file. Every ``base_every_s`` seconds (or
``max_deltas`` deltas) a snapshot writes a new *base* instead: a full RocksDB
checkpoint. Restoring snapshot ``s`` opens its base and applies its deltas in
order; each delta holds whole states, so the last write of a key wins. Flink's
changelog state backend makes the same trade.

>>> chain = Chain(base_every_s=5.0, max_deltas=100)
>>> chain.needs_base(now=0.0)                 # nothing to build on yet
True
>>> chain.add_base(1, now=0.0); chain.needs_base(now=1.0)
False
>>> chain.add_delta(2); chain.add_delta(3); chain.entry("count-0")
{'participant': 'count-0', 'base': 1, 'deltas': [2, 3]}
>>> chain.needs_base(now=5.0)
True
>>> decode_delta(encode_delta([(b"k", b"v")]))
[(b'k', b'v')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import msgpack

#: File name of a delta inside a participant's directory of a snapshot.
DELTA_FILE = "DELTA"

_DELTA_VERSION = 1


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


def encode_delta(pairs: list) -> bytes:
    """A delta file: encoded ``(key, state)`` byte pairs, in the order they were written. O(bytes)."""
    return msgpack.packb([_DELTA_VERSION, [[k, v] for k, v in pairs]], use_bin_type=True)


def decode_delta(data: bytes) -> list:
    """The ``(key, state)`` byte pairs of a delta file; DeltaError if it is not one. O(bytes).

    >>> decode_delta(b"junk")
    Traceback (most recent call last):
    ...
    driftstream.snapshots.changelog.DeltaError: not a delta file: ExtraData(106, b'unk')
    """
    try:
        version, pairs = msgpack.unpackb(data, raw=True, use_list=True, strict_map_key=True)
        if version != _DELTA_VERSION:
            raise DeltaError(f"delta format {version!r}, this build reads {_DELTA_VERSION}")
        out = [(k, v) for k, v in pairs]
    except DeltaError:
        raise
    except Exception as exc:
        raise DeltaError(f"not a delta file: {exc!r}") from exc
    if not all(type(k) is bytes and type(v) is bytes for k, v in out):
        raise DeltaError("not a delta file: its pairs are not bytes")
    return out
