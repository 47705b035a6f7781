"""What a sender keeps of its output for local recovery (``recovery="local"``): per receiver,
every item it sent at or after the last committed snapshot's time ``T``, in the order sent.

When a receiver fails, its replacement restores snapshot ``T`` and has this part re-sent
(as new batches, on the replacement's channel); the log keeps it until the next commit
trims it to that snapshot's time. Speculative items and their tombstones are kept alike: the
replacement repairs them as any arrival. Not yet spilled past a memory budget (the design:
RocksDB).

>>> log = UpstreamLog()
>>> log.record("r", 5, [((1, 0, 0, 1, (), False), "a", "k"), ((3, 0, 0, 3, (), False), "b", "k")])
>>> log.record("r", 5, [((3, 0, 0, 3, (), True), "b", "k")])
>>> log.trim((2, 0, 0, 0)); [p for _, p, _ in log.replay("r")[5]]
['b', 'b']
>>> len(log), log.replay("nobody")
(2, {})
"""

from __future__ import annotations

from typing import Hashable

from .meta import Time
from .peer_items import PeerItems


class UpstreamLog(PeerItems):
    """Per receiver: per entry step, the ``(meta, payload, key)`` items sent to it at or
    after the trim time, in the order sent. O(1) per item recorded, O(items) per trim."""

    def trim(self, t: Time) -> None:
        """Snapshot ``t`` committed: forget what was sent below ``t`` (a restore starts at it)."""
        self.drop_below(t)

    def replay(self, receiver: Hashable) -> dict:
        """What a replacement of ``receiver`` restored at the trim time is sent again: entry
        step -> items, in the order first sent (copies)."""
        return {entry: list(items) for entry, items in self.items.get(receiver, {}).items() if items}

    def __len__(self) -> int:
        return sum(len(items) for entries in self.items.values() for items in entries.values())
