"""What the replicas of an instance digest and report under ``verify="majority"`` (issue 58,
design item 5), written once for the simulator (:mod:`.simulated_votes`) and Ray
(:mod:`.replica_voter` on each replica, :mod:`driftstream.ordering.epoch_votes` in the acker):

- :func:`host_state_digest`: a replica's folded keyed state (value, entries, windows' open
  state), the part of an epoch's digest that certifies the snapshot at its end;
- :class:`DigestedLog`: its upstream log, which digests the net of what it sends;
- :class:`Dissent`: a vote's disagreement as ``status()`` and ``metrics.dissents`` show it;
- :class:`VoteRollback`: on Ray, what the acker ends its wait with when a vote rolls the run back.

>>> from driftstream.engine.model.plan import Instance
>>> d = Dissent(Instance(1, 0), [5], 2, ((3,), (9,)), {4: "a", 5: "b", 6: "a"}, "corruption")
>>> d.report()["instance"], VoteRollback([d.report()]).dissents[0]["replicas"]
('1/0', [5])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from driftstream.ordering.replica_digests import ReplicaDigest, state_digest
from driftstream.ordering.upstream_log import UpstreamLog

from driftstream.engine.model.plan import Instance


@dataclass
class Dissent:
    """Replicas of ``instance`` that disagreed on epoch ``epoch`` (its times ``t_range``: ``(T,
    T')``, None for the beginning or the end): ``replicas`` (the dissenters' incarnations; all
    of them without a majority), every voter's ``digests``, ``kind`` (``"corruption"``,
    ``"mismatch"``, ``"likely non-determinism"``), the stage's ``steps`` and what was done."""

    instance: Instance
    replicas: list
    epoch: int
    t_range: tuple
    digests: dict
    kind: str
    steps: list = field(default_factory=list)
    action: str = ""
    #: verify="sample:N": the epoch's output had left the sinks before the vote (a corrupt primary's stays there)
    released: bool = False

    def report(self) -> dict:
        """As ``metrics.dissents`` and ``status()["dissents"]`` show it (instance ``"stage/index"``)."""
        return dict(dataclasses.asdict(self), instance=f"{self.instance.stage}/{self.instance.index}")


class VoteRollback(Exception):
    """On Ray: a vote found the primary corrupt, or no majority; the run rolls back to the newest
    committed snapshot (under the gate every committed one was certified). ``dissents``: every
    dissent of the acker's incarnation so far (:meth:`Dissent.report`), the last the cause."""

    def __init__(self, dissents: list) -> None:
        super().__init__(dissents)
        self.dissents = dissents

    def __str__(self) -> str:
        last = self.dissents[-1]
        return f"{last['kind']} of {last['instance']}'s replicas {last['replicas']} in t {last['t_range']}"


class DigestedLog(UpstreamLog):
    """A replica's upstream log that digests what it records, what the replica sends (before a
    secondary's cut drops it), into ``digest``."""

    def __init__(self, digest: ReplicaDigest) -> None:
        super().__init__()
        self.digest = digest

    def record(self, peer: Any, entry: int, items: list) -> None:
        super().record(peer, entry, items)
        self.digest.sent((peer, entry), items)


def host_state_digest(host: Any) -> str:
    """The digest of a host's folded keyed state: value state by key, entry state by ``(key,
    entry)`` (its records, in the state cache under it), and its windows' (and interval joins')
    open state by its state key (a window's ``(key, start, end)``, a session's key)."""
    return state_digest((sid, key, value) for sid, ks in keyed_states(host) for key, value in _settled(ks.backend))


def keyed_states(host: Any) -> list:
    """``(step id, DriftingKeyedState)`` of a host's keyed steps and of its timed steps' state
    (a window's folded state is a keyed state under it: what closes is then read from it)."""
    rt = host.rt
    return sorted([*rt.keyed.items(), *((sid, ws.keyed) for sid, ws in rt.windows.items())], key=lambda pair: pair[0])


def _settled(backend: Any) -> Any:
    """The ``(key, value)`` records a keyed state's backend holds (none: it cannot list them)."""
    listing = getattr(backend, "items", None) or getattr(getattr(backend, "cache", None), "items", None)
    return () if listing is None else listing()
