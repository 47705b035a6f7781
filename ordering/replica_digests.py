"""Digests of what replicas settle, epoch by epoch, and the vote over them (issue 58, design
item 5, ``verify="majority"`` and ``"sample:N"``: one epoch in N digested and voted).

Replicas of an instance get the same input in the same t order, so what they settle is the
same: what their sinks release below the watermark (in Meta order), their folded keyed
state at a watermark, and the net of what they send downstream (each element less its
tombstones: speculative versions and their cancels differ with arrival orders, the net does not).

An *epoch* is a snapshot interval: epoch ``k`` holds the times in ``[T_k, T_k+1)``, where
``T_1 < T_2 < ...`` are the snapshots' times (:class:`Epochs`; epoch 0 starts at the
beginning). A replica's digest of epoch ``k`` (:class:`ReplicaDigest`) hashes what each of its
sink partitions released in the epoch, in release order, the net of what it sent, and its
folded state at ``T_k+1``;
the state is compared too because output alone cannot certify a snapshot: a value flipped at
``t=5`` that no element reads before ``t=15`` leaves epoch ``[0, 10)``'s output right and
snapshot ``10`` wrong. :func:`vote` takes one digest per replica and names the dissenters.

>>> epochs = Epochs(); epochs.add((10,))
>>> a, b, c = ReplicaDigest(epochs), ReplicaDigest(epochs), ReplicaDigest(epochs)
>>> for d, k in ((a, 1), (b, 1), (c, flipped(1))):     # a flipped value in c's state
...     d.released("out", [((3, 0, 0, 3), "x"), ((12, 0, 0, 12), "y")])
...     d.ended(0, state_digest([("key", k)]))
>>> v = vote({1: a.digest(0), 2: b.digest(0), 3: c.digest(0)})
>>> v.agreed == a.digest(0), v.dissenters, a.digest(1)  # epoch 1 has not ended yet
(True, [3], None)
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Optional


class Epochs:
    """The run's epoch boundaries, the snapshots' times in the order they began (each greater
    than the last). ``of(t)``: the epoch of time ``t``; ``range(k)``: ``(T_k, T_k+1)`` (None:
    the beginning, or not ended yet); ``sampled(k)``: whether epoch ``k`` is digested and
    voted, one in ``every`` (``verify="sample:N"``; all of them by default).

    >>> e = Epochs(); e.add((4,)); e.add((9,))
    >>> e.of((2, 0, 0, 2)), e.of((4, 0, 0, 4)), e.of((9, 1, 0, 0)), e.range(1), e.range(2)
    (0, 1, 2, ((4,), (9,)), ((9,), None))
    >>> [k for k in range(7) if Epochs(every=3).sampled(k)]
    [0, 3, 6]
    """

    def __init__(self, every: int = 1) -> None:
        self.boundaries: list = []
        self.every = every

    def sampled(self, k: int) -> bool:
        # fixed by the index alone: every replica, a replacement too, digests the same epochs
        return k % self.every == 0

    def add(self, t: tuple) -> None:
        """A snapshot began at ``t``: an epoch ends there (a repeat of the last is ignored)."""
        if not self.boundaries or t > self.boundaries[-1]:
            self.boundaries.append(t)

    def of(self, t: tuple) -> int:
        return bisect_right(self.boundaries, t)

    def range(self, k: int) -> tuple:
        b = self.boundaries
        return (b[k - 1] if 0 < k <= len(b) else None, b[k] if k < len(b) else None)

    def cut(self, k: int) -> None:
        """A rollback to the start of epoch ``k``: the boundaries after it are forgotten."""
        del self.boundaries[k:]


def _encoded(value: Any) -> bytes:
    """A canonical encoding: ``repr`` of plain data (tuples, strings, numbers) is one string
    whatever process made it; a set or dict is ordered first."""
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=repr)
    elif isinstance(value, dict):
        value = sorted(value.items(), key=repr)
    return repr(value).encode()


def state_digest(items: Iterable[tuple]) -> str:
    """An order-free digest of ``(key, state)`` pairs (a backend's ``items()``).

    >>> state_digest([("a", 1), ("b", 2)]) == state_digest([("b", 2), ("a", 1)]) != state_digest([("a", 1)])
    True
    """
    h = hashlib.blake2b(digest_size=16)
    for line in sorted(_encoded(pair) for pair in items):
        h.update(line)
        h.update(b"\n")
    return h.hexdigest()


class ReplicaDigest:
    """One replica's digests per epoch of ``epochs``: of what each sink released
    (:meth:`released`) and of its state at the epoch's end (:meth:`ended`). ``first``: the
    first epoch it saw whole (a replica started at a snapshot's time: that epoch); ``since``:
    and none that begins before this time (its sinks released what others skipped)."""

    def __init__(self, epochs: Epochs, first: int = 0, since: Optional[tuple] = None) -> None:
        self.epochs, self.first, self.since = epochs, first, since
        self._sinks: dict = {}  # epoch -> sink -> running hash
        # (Meta but its tombstone flag, (receiver, it, payload) encoded) -> +1 an element, -1 a
        # tombstone; by time, not epoch: a send runs ahead of the watermark, so of boundaries not yet known
        self._sent: Counter = Counter()
        self._states: dict = {}  # epoch -> its state digest at the epoch's end

    def released(self, sink: Hashable, elements: Iterable[tuple]) -> None:
        """``elements`` (``(Meta, payload)``, in release order) left ``sink`` (those of an epoch
        not sampled are not hashed: a release is below every boundary still to come, so its
        epoch is known)."""
        boundaries, run, k, until = self.epochs.boundaries, [], None, None
        for meta, payload in elements:  # in Meta order: an epoch's run of them is hashed at once
            if k is None or until is not None and not meta < until:
                self._hash_run(sink, k, run)
                k = self.epochs.of(meta)
                until, run = boundaries[k] if k < len(boundaries) else None, []
            run.append(repr((tuple(meta), payload)).encode())  # (= _encoded: a tuple)
        self._hash_run(sink, k, run)

    def _hash_run(self, sink: Hashable, k: Optional[int], run: list) -> None:
        """Hash ``run`` (encoded elements of epoch ``k``) into ``sink``'s hash of it, if sampled."""
        if not run or not self.epochs.sampled(k):
            return
        per = self._sinks.setdefault(k, {})
        h = per.get(sink)
        if h is None:
            h = per[sink] = hashlib.blake2b(repr(sink).encode(), digest_size=16)
        h.update(b"".join(run))

    def sent(self, receiver: Hashable, items: Iterable[tuple]) -> None:
        """``items`` (``(Meta, payload, ...)``, tombstones among them) went to ``receiver``."""
        sent, to = self._sent, repr(receiver)
        for item in items:
            meta = item[0]
            t = tuple(meta[:5])
            sent[(t, f"({to}, {t!r}, {item[1]!r})".encode())] += -1 if meta[5] else 1  # (= _encoded((receiver, t, payload)))

    def ended(self, k: int, state: str) -> None:
        """Epoch ``k`` ended: its watermark passed the epoch's end, its state then was ``state``
        (again: the state it was snapshotted with, which the vote then sees)."""
        self._states[k] = state

    def covers(self, k: int) -> bool:
        """Whether it saw epoch ``k`` whole (it votes on it)."""
        if k < self.first:
            return False
        start = self.epochs.range(k)[0]
        return self.since is None or (start is not None and start >= self.since)  # (not begun yet: None)

    def digest(self, k: int) -> Optional[str]:
        """Epoch ``k``'s digest (None: not ended yet, or not seen whole)."""
        if k not in self._states or not self.covers(k):
            return None
        h = hashlib.blake2b(self._states[k].encode(), digest_size=16)
        for sink, part in sorted(self._sinks.get(k, {}).items(), key=lambda kv: repr(kv[0])):
            h.update(repr(sink).encode() + part.digest())
        of = self.epochs.of
        for item, n in sorted((item, n) for (t, item), n in self._sent.items() if n and of(t) == k):
            h.update(item + b"%d\n" % n)
        return h.hexdigest()

    def forget(self, k: int) -> None:
        """Epoch ``k`` is voted: its hashes go."""
        self._sinks.pop(k, None)
        of = self.epochs.of
        for key in [key for key in self._sent if of(key[0]) <= k]:
            del self._sent[key]
        self._states.pop(k, None)


@dataclass
class Vote:
    """The outcome of one epoch's vote: the digest a strict majority gave (None: no majority),
    the replicas that gave it, and the others (the dissenters; all of them without a majority)."""

    agreed: Optional[str]
    majority: list
    dissenters: list

    @property
    def kind(self) -> str:
        """``"corruption"`` (a majority names the dissenters) or ``"mismatch"`` (no majority)."""
        return "corruption" if self.agreed is not None else "mismatch"

    def rolls_back(self, primary: Hashable) -> bool:
        """Whether the run must roll back: no majority, or the ``primary`` dissents (its output
        went on optimistically and its receivers may have settled it). Else the dissenters,
        secondaries all, are taken out and the vote passes with the majority.

        >>> vote({1: "a", 2: "a", 3: "b"}).rolls_back(1), vote({1: "a", 2: "a", 3: "b"}).rolls_back(3), vote({1: "a", 2: "b"}).rolls_back(1)
        (False, True, True)
        """
        return self.agreed is None or primary in self.dissenters


def vote(digests: dict) -> Vote:
    """The vote over ``digests`` (replica -> its digest of one epoch): a strict majority agrees.

    >>> vote({1: "a", 2: "a", 3: "b"}), vote({1: "a", 2: "b"}).agreed
    (Vote(agreed='a', majority=[1, 2], dissenters=[3]), None)
    """
    counts = Counter(digests.values())
    best, n = counts.most_common(1)[0] if counts else (None, 0)
    if 2 * n <= len(digests):
        return Vote(None, [], sorted(digests))
    return Vote(best, sorted(r for r, d in digests.items() if d == best), sorted(r for r, d in digests.items() if d != best))


def flipped(value: Any) -> Any:
    """``value`` with one bit of it flipped (a fault a test injects): an int's low bit, a
    string's last character's, a tuple's last item's. None: nothing to flip.

    >>> flipped(4), flipped("ab"), flipped(("a", "b")), flipped(None)
    (5, 'ac', ('a', 'c'), None)
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value ^ 1
    if isinstance(value, str):
        return value[:-1] + chr(ord(value[-1]) ^ 1) if value else None
    if isinstance(value, tuple) and value:
        last = flipped(value[-1])
        return None if last is None else value[:-1] + (last,)
    return None
