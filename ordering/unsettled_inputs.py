"""What a receiver remembers of its inputs' senders for local recovery (``recovery="local"``):
per sender, the items it took at or after its watermark, so that when the sender fails it
can cancel what the dead incarnation sent and the replacement sends again.

Below the watermark ``W`` of the failure everything the dead sender sent is settled (applied
here, never to be tombstoned); its replacement drops its own copies below ``W``. At or above
``W`` the dead incarnation may have sent speculative elements it would have cancelled later,
or a tombstone whose element was lost with it. :meth:`UnsettledInputs.cancel` returns what
undoes exactly the net of those: a tombstone for each element still live, the element for
each tombstone that met none (drifting state and barriers annihilate the pair in any order).
The replacement's stream from ``W`` then arrives like any other.

>>> u = UnsettledInputs()
>>> e, t = (5, 0, 0, 5, (), False), (5, 0, 0, 5, (), True)
>>> u.record("x", 2, [(e, "v1", "k"), (t, "v1", "k"), (e, "v2", "k"), ((7, 0, 0, 7, (), True), "w", "k")])
>>> u.cancel("x", (4,))   # v1 met its tombstone; v2 is live; w's element never came
{2: [((5, 0, 0, 5, (), True), 'v2', 'k'), ((7, 0, 0, 7, (), False), 'w', 'k')]}
>>> u.cancel("x", (4,))
{}
"""

from __future__ import annotations

from typing import Hashable

from .meta import Time, invalidee_of, tombstone_of
from .peer_items import PeerItems


class UnsettledInputs(PeerItems):
    """Per sender, per entry step: the ``(meta, payload, key)`` items taken from it at or
    after the last watermark :meth:`settle` was given. O(1) per item recorded."""

    def settle(self, watermark: Time) -> None:
        """Forget the items below ``watermark``: settled, never cancelled. O(items)."""
        self.drop_below(watermark)

    def cancel(self, sender: Hashable, cut: Time) -> dict:
        """``sender`` failed with the watermark at ``cut``: entry step -> the items that undo
        the net of what it sent at or above ``cut`` (see the module doc), which are then
        forgotten. Elements and tombstones are matched by Meta and equal payload."""
        entries = self.items.get(sender, {})
        out: dict = {}
        for entry, items in entries.items():
            kept, net = [], {}  # invalidee meta -> [[payload, key, count]]
            for item in items:
                meta = item[0]
                if meta < cut:
                    kept.append(item)
                    continue
                rows = net.setdefault(invalidee_of(meta), [])
                sign = -1 if meta[5] else 1
                for row in rows:
                    if row[0] == item[1]:
                        row[2] += sign
                        break
                else:
                    rows.append([item[1], item[2], sign])
            undo = []
            for meta, rows in net.items():
                for payload, key, count in rows:
                    # count > 0: elements still live, undone by tombstones; < 0: lone tombstones, met by their element
                    undo.extend([(tombstone_of(meta) if count > 0 else meta, payload, key)] * abs(count))
            entries[entry] = kept
            if undo:
                out[entry] = undo
        return out
