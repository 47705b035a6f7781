"""Which committed snapshots a simulated run's votes certified (``verify="majority"`` or
``"sample:N"``; see simulated_votes.py), so which one a rollback or a replacement replica may
restore. Snapshot ``k`` begins epoch ``k`` (it was taken at boundary ``k - 1``) and is certified
once every instance passed epoch ``k - 1`` (the votes' *frontier*), that epoch was voted (sample:N
votes one in N), and no later marker found the state it was taken from corrupt (*tainted*).

A restart (a rollback, or a rescale to another parallelism) restores one certified snapshot: it
stays certified whatever a marker at its boundary finds later (that marker begins another
snapshot, which the first at a boundary does not give way to), and after a rescale no snapshot
before it will do (they hold the old parallelism's parts).

>>> c = CertifiedSnapshots()
>>> c.commit(1, 7); c.commit(2, 9); c.commit(2, 11)  # the first at a boundary stays
>>> c.target(frontier=2, sampled=lambda k: True), c.holds(9, 2, lambda k: True)
((2, 9), True)
>>> c.taint(2); c.target(2, lambda k: True)
(1, 7)
>>> c.rescaled(3, 12); c.taint(3); c.target(3, lambda k: True)  # restarted from: not tainted
(3, 12)
"""

from __future__ import annotations

from typing import Callable, Optional


class CertifiedSnapshots:
    """``committed``: epoch index -> the id of the committed snapshot that begins it (the first at
    its boundary); ``tainted``: epochs whose snapshot holds a state gone corrupt after its vote;
    ``restarted_at``: the epoch the running incarnation restarted at."""

    def __init__(self) -> None:
        self.committed: dict = {}
        self.tainted: set = set()
        self.restarted_at = 0

    def commit(self, k: int, snapshot_id: int) -> None:
        """Snapshot ``snapshot_id`` begins epoch ``k`` (one taken again at its boundary, after a
        restart there, does not replace the first: the vote that certifies it saw the state of then)."""
        self.committed.setdefault(k, snapshot_id)

    def taint(self, k: int) -> None:
        """Snapshot ``k`` was taken from a state that went corrupt after its vote: never restored
        (unless the run restarted from it: taken before, it is not the one the marker began)."""
        if k > self.restarted_at:
            self.tainted.add(k)

    def epochs(self, frontier: int, sampled: Callable[[int], bool]) -> list:
        """The epochs that begin at a certified snapshot, every instance having passed ``frontier``
        epochs; ``sampled(k)``: whether epoch ``k`` was voted."""
        return [k for k in self.committed if k <= frontier and k not in self.tainted and sampled(k - 1)]

    def target(self, frontier: int, sampled: Callable[[int], bool], kept: Optional[set] = None) -> tuple:
        """``(epoch, snapshot id)`` of the newest certified snapshot (among ``kept``, if given: the
        store prunes; ``(0, None)``: the beginning)."""
        certified = [k for k in self.epochs(frontier, sampled) if kept is None or self.committed[k] in kept]
        return (max(certified), self.committed[max(certified)]) if certified else (0, None)

    def holds(self, snapshot_id: int, frontier: int, sampled: Callable[[int], bool]) -> bool:
        """Whether ``snapshot_id`` is certified."""
        return any(self.committed[k] == snapshot_id for k in self.epochs(frontier, sampled))

    def rolled_back(self, epoch: int) -> None:
        """Every instance restarts from the snapshot that begins ``epoch``: the later ones go."""
        self.committed = {k: s for k, s in self.committed.items() if k <= epoch}
        self.tainted = {k for k in self.tainted if k <= epoch}
        self.restarted_at = epoch

    def rescaled(self, epoch: int, snapshot_id: int) -> None:
        """Every instance restarts at another parallelism from ``snapshot_id`` (the rescale's
        snapshot, which begins ``epoch``, reassigned): it alone is certified from here."""
        self.committed, self.tainted, self.restarted_at = {epoch: snapshot_id}, set(), epoch
