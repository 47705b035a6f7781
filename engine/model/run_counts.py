"""A run's counts that survive its recoveries: the elements each sink settled (released to
it, or dropped as replayed output it already held) and the dead letters of each failing
step, below a snapshot's T.

A stage instance answers a snapshot at T with what its sinks settled below T in its
incarnation (:class:`~driftstream.barriers.settled.SettledCount`); the manifest holds
the run's totals: the restored manifest's, plus its parts' (so a rescale, whose parts
differ, keeps them). A recovery replays from T, so what a run shows across recoveries
is the totals of the manifest it restored plus what the new incarnation counts itself.

>>> a = RunCounts({"out": 3}, {"parse": 1})
>>> b = a + RunCounts.of_settled([{None: 2}, {"parse": 1, "window": 2}], ["out", "dlq"])
>>> b
RunCounts(released={'out': 5, 'dlq': 3}, dead_letters={'parse': 2, 'window': 2})
>>> b - a == RunCounts({"out": 2, "dlq": 3}, {"parse": 1, "window": 2})
True
>>> RunCounts.from_json(b.to_json()) == b, RunCounts.from_json(None) is None
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional


@dataclass(frozen=True)
class RunCounts:
    """``released``: sink name -> elements it settled (dead-letter sinks included);
    ``dead_letters``: failing step -> its dead letters settled at a dead-letter sink."""

    released: Mapping[str, int] = field(default_factory=dict)
    dead_letters: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of_settled(cls, settled: Iterable[Mapping[Any, int]], sinks: Iterable[str]) -> "RunCounts":
        """From each sink's settled counts (:class:`~driftstream.barriers.settled.SettledCount`:
        None -> n for a plain sink, step -> n for a sink of dead letters), with the sinks' names."""
        released: dict = {}
        letters: dict = {}
        for counts, sink in zip(settled, sinks):
            released[sink] = released.get(sink, 0) + sum(counts.values())
            for step, n in counts.items():
                if step is not None:
                    letters[step] = letters.get(step, 0) + n
        return cls(released, letters)

    def __add__(self, other: "RunCounts") -> "RunCounts":
        return RunCounts(_combine(self.released, other.released, 1), _combine(self.dead_letters, other.dead_letters, 1))

    def __sub__(self, other: "RunCounts") -> "RunCounts":
        return RunCounts(_combine(self.released, other.released, -1), _combine(self.dead_letters, other.dead_letters, -1))

    def to_json(self) -> dict:
        return {"released": dict(self.released), "dead_letters": dict(self.dead_letters)}

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional["RunCounts"]:
        """The counts ``data`` holds; None for None (a manifest written before counts were kept)."""
        if data is None:
            return None
        return cls({k: int(v) for k, v in data.get("released", {}).items()}, {k: int(v) for k, v in data.get("dead_letters", {}).items()})


def _combine(a: Mapping[str, int], b: Mapping[str, int], sign: int) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + sign * v
    return out


#: No counts: a fresh start, or a manifest written before counts were kept.
ZERO = RunCounts()
