"""The XOR ack table: global time -> XOR of the ids (batches, timers) that hold it.

Every update of the acker's watermark bookkeeping is an XOR of a 64-bit id into the
entry of a time: a sender's batch and its receiver's ack, a window's timer set and
fired, an entry moved from one time to another. :class:`AckTable` is that one
operation, written once (Timely's ``ChangeBatch`` is the model: updates accumulate in
a map and are drained as one message). It is a ``dict`` so that reading it (``t in``,
``[t]``, iterating, sending it) costs nothing extra.

>>> acks = AckTable()
>>> acks.xor((1, 0, 0, 1), 0xA5)
165
>>> acks.move((1, 0, 0, 1), (2, 0, 0, 2), 0xA5)   # the hold moves on to t 2
>>> acks
{(1, 0, 0, 1): 0, (2, 0, 0, 2): 165}
>>> acks.drain(), acks
({(1, 0, 0, 1): 0, (2, 0, 0, 2): 165}, {})
>>> live = AckTable(); live.fold({(3, 0, 0, 3): 7}), live.fold({(3, 0, 0, 3): 7}), live
([(3, 0, 0, 3)], [], {})

Costs: ``xor`` O(1) (a lookup and a store); ``xor_many`` and ``fold`` O(k) for k
times; ``drain`` O(n) for the n entries it hands out (a copy; the table is cleared).
"""

from __future__ import annotations

from typing import Iterable, Mapping


class AckTable(dict):
    """Time -> XOR of the ids in flight at it. ``xor`` keeps entries that return to zero
    (a stage's table is sent as it is: the acker folds the zero in); ``fold`` drops them
    (the acker's table holds the times still in flight, nothing else)."""

    __slots__ = ()

    def xor(self, t: tuple, x: int) -> int:
        """XOR ``x`` into the entry of ``t``; returns the new value."""
        v = self[t] = self.get(t, 0) ^ x
        return v

    def xor_many(self, times: Iterable, x: int) -> None:
        """XOR ``x`` into the entry of each time of ``times`` (a batch's times, its id)."""
        get = self.get
        for t in times:
            self[t] = get(t, 0) ^ x

    def move(self, old: tuple, new: tuple, x: int) -> None:
        """Move the hold of id ``x`` from time ``old`` to ``new`` (XORed out of one, into the other)."""
        self[old] = self.get(old, 0) ^ x
        self[new] = self.get(new, 0) ^ x

    def fold(self, xors: Mapping) -> list:
        """XOR every entry of ``xors`` in, removing entries back at zero; returns the times
        that were absent and are now non-zero, in ``xors``' order."""
        new = []
        for t, x in xors.items():
            v = self.get(t, 0) ^ x
            if v:
                if t not in self:
                    new.append(t)
                self[t] = v
            elif t in self:
                del self[t]
        return new

    def drain(self) -> dict:
        """The entries as a plain dict (what a flush sends); the table is left empty."""
        out = dict(self)
        self.clear()
        return out
