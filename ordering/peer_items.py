"""Items kept per peer instance and per entry step, until a time passes them: what local
recovery's logs have in common (a sender's :class:`~.upstream_log.UpstreamLog`, a receiver's
:class:`~.unsettled_inputs.UnsettledInputs`).

>>> kept = PeerItems()
>>> kept.record("p", 5, [((1, 0, 0, 1, (), False), "a", "k"), ((3, 0, 0, 3, (), False), "b", "k")])
>>> kept.drop_below((2, 0, 0, 0)); [p for _, p, _ in kept.items["p"][5]]
['b']
"""

from __future__ import annotations

from typing import Hashable

from .meta import Time


class PeerItems:
    """Per peer, per entry step, the ``(meta, payload, key)`` items recorded, in order. O(1) per
    item recorded, O(items) per :meth:`drop_below`."""

    def __init__(self) -> None:
        self.items: dict = {}  # peer -> entry step -> items

    def record(self, peer: Hashable, entry: int, items: list) -> None:
        """``items`` (a batch) went between this instance and ``peer``'s step ``entry``."""
        if items:
            self.items.setdefault(peer, {}).setdefault(entry, []).extend(items)

    def drop_below(self, t: Time) -> None:
        """Forget every item whose meta is below ``t``."""
        for entries in self.items.values():
            for entry, items in entries.items():
                if any(item[0] < t for item in items):
                    entries[entry] = [item for item in items if not item[0] < t]
