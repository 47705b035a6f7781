"""The supervisor's record of the replicas' dissents on Ray (``verify="majority"`` and
``"sample:N"``; issue 58, design item 5). The acker tallies the votes (:mod:`driftstream.ordering.epoch_votes`) and keeps
the dissents of its incarnation; a vote that rolls the run back ends the acker's wait with a
:class:`~driftstream.engine.runtime.replica_votes.VoteRollback`, and the supervisor restarts
every instance from the newest committed snapshot (each was certified: the primaries' parts
wait for their gates). This keeps every dissent across those restarts, for ``status()`` and
``metrics.dissents``, and names the rollback in its recovery's ``kind``. Replicas that disagree
with no majority again over the times they disagreed on before, after the rollback replayed them
(:data:`MISMATCHES_IN_A_ROW` times), are likely non-deterministic, not corrupt: the run fails
saying so rather than roll back forever (the simulator takes the primary's output unverified
from the second; on Ray a restarted acker does not yet know it). Under ``"sample:N"`` only the
snapshots at the end of a sampled epoch are certified (the store keeps the newest, ``pinned``):
before the rollback the committed ones after it are set aside (:meth:`set_aside_uncertified`).

>>> from types import SimpleNamespace as NS
>>> from driftstream.engine.runtime.replica_votes import VoteRollback
>>> records = ReplicaDissents(NS(acker=None))
>>> def mismatch(end): return VoteRollback([{"kind": "mismatch", "instance": "1/0", "replicas": [3, 4], "t_range": ((2,), (end,)), "digests": {}}])
>>> records.rolled_back(mismatch(5))
>>> records.take_kind(), records.take_kind(), len(records.seen)
("global (vote: mismatch of 1/0's replicas [3, 4] in t ((2,), (5,)))", None, 1)
>>> records.rolled_back(mismatch(6)) is None, type(records.rolled_back(mismatch(7))).__name__  # each replay disagreed again
(True, 'FlowError')
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import ray

from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.replica_votes import VoteRollback

log = logging.getLogger(__name__)

#: mismatches of one instance's replicas, each over times the one before covered, after which the run fails
MISMATCHES_IN_A_ROW = 3


class ReplicaDissents:
    """Every dissent of ``launcher``'s runs so far (``seen``, :meth:`Dissent.report` dicts), and
    the vote rollback that the next recovery answers."""

    def __init__(self, launcher: Any, store: Any = None) -> None:
        self.launcher = launcher
        #: the snapshot store, whose ``pinned`` says which snapshots a vote certified (None: every committed one)
        self.store = store
        self.seen: list = []
        self.rollback: Optional[VoteRollback] = None
        #: instance -> the end of its last mismatch's times, and how many mismatches in a row covered them
        self._rechecking: dict = {}

    def rolled_back(self, error: VoteRollback) -> Optional[FlowError]:
        """The acker ended the run's watch with ``error``: the next recovery is its rollback.
        A FlowError instead (the run fails with it) when one instance's replicas disagreed with no
        majority :data:`MISMATCHES_IN_A_ROW` times, each over times the one before covered (the
        replay of a rollback disagreed again): a step that is not deterministic."""
        self._merge(error.dissents)
        last = error.dissents[-1]
        if last["kind"] == "mismatch":
            (start, end), before = last["t_range"], self._rechecking.get(last["instance"])
            again = before is not None and (start is None or tuple(start) < tuple(before[0]))  # (a restarted acker's first epoch: from the bottom)
            self._rechecking[last["instance"]] = (end, before[1] + 1 if again else 1)
        if self._rechecking.get(last["instance"], (None, 0))[1] >= MISMATCHES_IN_A_ROW and last["kind"] == "mismatch":
            return FlowError(f"the replicas of instance {last['instance']} disagreed {MISMATCHES_IN_A_ROW} times with no majority, "
                             f"each again over what it disagreed on before (replayed), the last time in t {last['t_range']} "
                             f"({last['digests']}): a step of its stage is likely not deterministic (declare a draw with "
                             "deterministic=False before the key_by, or run with verify='first')")
        self.rollback = error
        aside = self.set_aside_uncertified(str(error))
        log.warning("driftstream: %s; every instance restarts from the newest %s snapshot%s", error,
                    "committed" if self.store is None or self.store.pinned is None else "certified",
                    f" (set aside, not certified: {aside})" if aside else "")
        return None

    def set_aside_uncertified(self, why: str) -> list:
        """``verify="sample:N"``: take the committed snapshots after the newest one a vote
        certified out of use (quarantined, with ``why``), so that the rollback restores that one
        (none: the beginning; the sinks keep what they hold). The ids set aside."""
        if self.store is None:
            return []
        # (majority: no pinned, every committed snapshot was certified)
        return self.store.set_aside_unpinned(f"not certified by a vote (verify='sample:N'), set aside for the rollback of: {why}")

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
