"""The acker's tally of the replicas' votes on Ray (``verify="majority"`` and ``"sample:N"``; issue
58, design item 5): each replica of a replicated instance sends its digest of every epoch (the times between two
snapshot markers, and after the last one the run's end); once every live replica of an instance
sent its digest of the instance's next epoch, the epoch is voted (:func:`~.replica_digests.vote`).

- All agree: the instance passed the epoch.
- A strict majority against secondaries only: a :class:`Verdict` names them; they vote no more
  (the acker takes them out of service) and the epoch passes with the majority.
- Against the primary, or no majority: a :class:`Verdict` that rolls back; nothing passes after
  it (the run restarts from the newest certified snapshot, with a new tally).

:meth:`EpochVotes.released_through` is the gate: the primaries' sinks may be given what is below
it, the end of the last epoch every instance passed. An epoch is named by its end's snapshot id
(``None``: the run's end); two markers at one time make an empty epoch between them, still voted
on the replicas' state (a flip between the two markers).

Under ``"sample:N"`` (``every=N``) only the epochs whose end :func:`sampled` picks are digested and
voted; the others pass as soon as they end. :meth:`EpochVotes.certified` then holds for the
sampled ones alone (the state at the others' ends was never compared).

>>> votes = EpochVotes({"a": [1, 2, 3], "b": [4, 5, 6]})
>>> votes.ended(7, (10,)) + votes.ended(8, (20,))
[]
>>> [votes.add("a", inc, 7, "x") for inc in (1, 2, 3)], votes.released_through() == BOTTOM
([[], [], []], True)
>>> [votes.add("b", inc, 7, "y") for inc in (4, 5)], votes.add("b", 6, 7, "z")[0].dissenters, votes.released_through()
([[], []], [6], (10,))
>>> votes.voters["b"], votes.add("a", 1, 8, "p") + votes.add("a", 2, 8, "q") + votes.add("a", 3, 8, "q")
([4, 5], [Verdict(instance='a', epoch=8, t_range=((10,), (20,)), digests={1: 'p', 2: 'q', 3: 'q'}, dissenters=[1], kind='corruption', rolls_back=True)])
>>> one_in_two = EpochVotes({"a": [1, 2]}, every=2)
>>> one_in_two.ended(3, (10,)), one_in_two.released_through(), one_in_two.certified(3)  # 3 is not sampled: passed unvoted
([], (10,), False)
>>> one_in_two.ended(4, (20,)), one_in_two.add("a", 1, 4, "x"), one_in_two.add("a", 2, 4, "x"), one_in_two.certified(4)
([], [], [], True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Optional

from driftstream.ordering.meta import BOTTOM
from driftstream.ordering.replica_digests import vote


def sampled(snapshot_id: Optional[Hashable], every: int) -> bool:
    """Whether the epoch that ends at snapshot ``snapshot_id``'s marker is digested and voted under
    ``verify="sample:N"`` (``every`` = N; 1: all). Fixed by the id, which every replica (and the
    acker, and the committer, which keeps the newest certified snapshot) knows alike; the run's
    last epoch (None) always.

    >>> [sid for sid in range(1, 8) if sampled(sid, 3)], sampled(None, 3)
    ([3, 6], True)
    """
    return snapshot_id is None or every == 1 or snapshot_id % every == 0


@dataclass
class Verdict:
    """An epoch's vote that did not agree: ``instance``'s epoch ``epoch`` (its end's snapshot
    id; None: the run's end) over times ``t_range``, every voter's ``digests``, the
    ``dissenters``, ``kind`` (``"corruption"``: a majority named them; ``"mismatch"``: none)
    and whether the run must roll back (``rolls_back``: no majority, or the primary dissents)."""

    instance: Any
    epoch: Any
    t_range: tuple
    digests: dict
    dissenters: list
    kind: str
    rolls_back: bool


class EpochVotes:
    """The votes of the replicated instances: ``voters`` (instance -> its live replicas, the
    primary first), the epochs ended so far (:meth:`ended`, in marker order), and per instance
    the epochs it ``passed``. ``halted``: a verdict rolled back; nothing passes any more."""

    def __init__(self, voters: dict, start: tuple = BOTTOM, every: int = 1) -> None:
        self.every = every
        self.voters = {instance: list(incs) for instance, incs in voters.items()}
        self.ends: list = []  # (snapshot id, t) of each epoch's end, in order
        self.start = start
        self._index: dict = {}  # snapshot id -> its epoch's index
        self.passed = {instance: 0 for instance in self.voters}
        self._digests: dict = {}  # (instance, epoch index) -> {replica: digest}
        self.halted = False
        #: a replacement replica -> the first epoch it votes on (it saw no earlier one whole)
        self.since: dict = {}

    def ended(self, snapshot_id: Optional[Hashable], t: tuple) -> list:
        """A snapshot's marker at ``t`` went to the replicas (``snapshot_id`` None: the run's last
        watermark): an epoch ends there. The verdicts of the votes this completes (none: an
        epoch not sampled passes here, and a sampled one waits for its digests)."""
        self._index[snapshot_id] = len(self.ends)
        self.ends.append((snapshot_id, t))
        return [v for instance in self.voters for v in self._vote(instance)]

    def add(self, instance: Any, replica: Any, snapshot_id: Optional[Hashable], digest: str) -> list:
        """``replica`` of ``instance`` digested the epoch that ends at ``snapshot_id``; the
        verdicts of the votes this completes."""
        k = self._index.get(snapshot_id)
        if k is None or instance not in self.passed or k < self.passed[instance] or not sampled(snapshot_id, self.every):
            return []  # an epoch of before a reset, or voted without this replica already
        self._digests.setdefault((instance, k), {})[replica] = digest
        return self._vote(instance)

    def lost(self, instance: Any, replica: Any) -> list:
        """``replica`` died or was taken out: it votes no more; the verdicts of the votes that
        waited only for it."""
        if replica in self.voters.get(instance, ()):
            self.voters[instance].remove(replica)
        return self._vote(instance) if instance in self.voters else []

    def joined(self, instance: Any, replica: Any) -> None:
        """A replacement ``replica`` of ``instance`` caught up: it votes on the epochs that end from now on."""
        self.since[replica] = len(self.ends)
        self.voters[instance].append(replica)

    def released_through(self) -> tuple:
        """The end of the last epoch every instance passed: below it the gate is open."""
        k = min(self.passed.values(), default=0)
        return self.ends[k - 1][1] if k else self.start

    def certified(self, snapshot_id: Hashable) -> bool:
        """Whether every instance passed the epoch that ends at ``snapshot_id`` (its state certified)."""
        k = self._index.get(snapshot_id)
        return k is not None and sampled(snapshot_id, self.every) and all(k < n for n in self.passed.values())

    def _vote(self, instance: Any) -> list:
        """Vote ``instance``'s next epochs while every live replica digested them."""
        out = []
        while not self.halted and self.passed[instance] < len(self.ends):
            k = self.passed[instance]
            if not sampled(self.ends[k][0], self.every):  # sample:N: not digested, passes unvoted
                self.passed[instance] = k + 1
                continue
            got, voters = self._digests.get((instance, k), {}), self.voters[instance]
            live = [inc for inc in voters if self.since.get(inc, 0) <= k] if self.since else voters
            if not live or any(inc not in got for inc in live):
                break
            digests = {inc: got[inc] for inc in live}
            outcome = vote(digests)
            if outcome.dissenters:
                rolls_back = outcome.rolls_back(live[0])
                t_range = (self.ends[k - 1][1] if k else self.start, self.ends[k][1])
                out.append(Verdict(instance, self.ends[k][0], t_range, digests, outcome.dissenters, outcome.kind, rolls_back))
                if rolls_back:
                    self.halted = True
                    break
                for inc in outcome.dissenters:
                    voters.remove(inc)
            self._digests.pop((instance, k), None)
            self.passed[instance] = k + 1
        return out
