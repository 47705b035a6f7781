"""Which committed snapshot each recovery of a simulated run restores, as Ray's does.

- A global rollback (a crash's, or a vote's) restores the newest committed snapshot; with votes,
  the newest one every instance's vote certified, and the committed ones after it are set aside
  first (quarantined, saying why), as Ray's supervisor does: they may hold what a corrupt primary
  settled, and, restored by every replica, it would be agreed on from then on.
- A crash's local recovery restores what a global rollback would, except under ``"sample:N"``:
  the newest committed. On Ray a snapshot commits only once the vote its primaries' parts wait for
  passed (the newest committed is the newest certified; the simulator commits before the vote, so
  here a newer one may hold a corrupt primary's state), except under sample:N, whose votes come
  after the output. The victim has no replicas (a replica's crash fails over; one that leaves an
  instance none rolls back globally), so its own part holds no state a vote is owed.

>>> import tempfile
>>> from driftstream.snapshots.store import SnapshotStore
>>> store = SnapshotStore(tempfile.mkdtemp())
>>> points = RestorePoints(store, votes=None)
>>> points.restart() is None, points.local() is None, points.rollback("a crash")   # nothing committed yet
(True, True, (0, None))
>>> store.write_manifest(1, {"snapshot_id": 1, "flow": "f", "parallelism": 1, "t": [3], "parts": {}}); points.restart().snapshot_id
1

Costs: each call lists the store's committed snapshots (a directory listing) and reads one manifest.
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.engine.model.manifest import Manifest


class RestorePoints:
    """The restore points of a run whose snapshots go to ``store`` (None: no guarantee) and whose
    replicas vote in ``votes`` (a :class:`~.simulated_votes.SimulatedVotes`, or None)."""

    def __init__(self, store: Any, votes: Any) -> None:
        self.store, self.votes = store, votes

    def newest(self) -> Optional[Manifest]:
        """The newest committed manifest (None: none yet)."""
        data = self.store.read_latest_manifest()
        return None if data is None else Manifest.from_json(data)

    def restart(self) -> Optional[Manifest]:
        """What a global rollback restores (None: the beginning)."""
        return self.newest() if self.votes is None else self.manifest(self.target()[1])

    def local(self) -> Optional[Manifest]:
        """What a crash's local recovery restores (None: the beginning)."""
        return self.newest() if self.votes is not None and self.votes.sample is not None else self.restart()

    def target(self) -> tuple:
        """With votes: ``(epoch, snapshot id)`` of the newest certified snapshot the store holds."""
        return self.votes.rollback_target(set(self.store.committed_ids()))

    def rollback(self, why: str) -> tuple:
        """A global rollback begins: with votes, :meth:`target`, the committed snapshots after it set
        aside (saying ``why``); without, ``(0, None)``."""
        if self.votes is None:
            return 0, None
        target = self.target()
        self.store.set_aside_unpinned(f"not certified by a vote, set aside for a rollback ({why})")
        return target

    def manifest(self, snapshot_id: Optional[int]) -> Optional[Manifest]:
        """Committed snapshot ``snapshot_id``'s manifest (None: the beginning)."""
        return None if snapshot_id is None else Manifest.from_json(self.store.read_manifest(snapshot_id))
