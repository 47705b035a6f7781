"""The supervisor's record of the replicas' dissents on Ray (``verify="majority"``; issue 58,
design item 5). The acker tallies the votes (:mod:`driftstream.ordering.epoch_votes`) and keeps
the dissents of its incarnation; a vote that rolls the run back ends the acker's wait with a
:class:`~driftstream.engine.runtime.replica_votes.VoteRollback`, and the supervisor restarts
every instance from the newest committed snapshot (each was certified: the primaries' parts
wait for their gates). This keeps every dissent across those restarts, for ``status()`` and
``metrics.dissents``, and names the rollback in its recovery's ``kind``.

>>> from types import SimpleNamespace as NS
>>> from driftstream.engine.runtime.replica_votes import VoteRollback
>>> records = ReplicaDissents(NS(acker=None))
>>> records.rolled_back(VoteRollback([{"kind": "mismatch", "instance": "1/0", "replicas": [3, 4], "t_range": ((2,), (5,))}]))
>>> records.take_kind(), records.take_kind(), len(records.seen)
("global (vote: mismatch of 1/0's replicas [3, 4] in t ((2,), (5,)))", None, 1)
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import ray

from driftstream.engine.runtime.replica_votes import VoteRollback

log = logging.getLogger(__name__)


class ReplicaDissents:
    """Every dissent of ``launcher``'s runs so far (``seen``, :meth:`Dissent.report` dicts), and
    the vote rollback that the next recovery answers."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher
        self.seen: list = []
        self.rollback: Optional[VoteRollback] = None

    def rolled_back(self, error: VoteRollback) -> None:
        """The acker ended the run's watch with ``error``: the next recovery is its rollback."""
        self._merge(error.dissents)
        self.rollback = error
        log.warning("driftstream: %s; every instance restarts from the newest committed snapshot", error)

    def take_kind(self) -> Optional[str]:
        """The kind of the recovery that answers the rollback (None: it was not one); once."""
        error, self.rollback = self.rollback, None
        return None if error is None else f"global (vote: {error})"

    def gather(self, timeout: float = 2.0) -> list:
        """Every dissent so far: the acker's incarnation's (asked, within ``timeout`` s; a dead
        acker's are lost) after those of the incarnations before."""
        acker = self.launcher.acker
        if acker is not None:
            try:
                self._merge(ray.get(acker.dissent_reports.remote(), timeout=timeout))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
                pass
        return list(self.seen)

    def _merge(self, dissents: list) -> None:
        for d in dissents:
            if d not in self.seen:
                self.seen.append(d)
