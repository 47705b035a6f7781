"""A set of warm actors: started actors with no flow, as the driver's pool holds them and a flow
takes them (see :mod:`.warm_actors`), and their retirement when the flow ends.

>>> WarmActors([("h1", "__warm__/1/0")], [("h2", "__warm__/1/1")]).split({"__warm__/1/1"})[0].names()
['__warm__/1/1']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import ray

from driftstream.engine.runtime.ray_session import kill_actors

#: A warm actor's Ray name is this, the driver's pid and a count (no flow's name starts so).
WARM_PREFIX = "__warm__/"


@dataclass
class WarmActors:
    """Started actors with no flow: ``stages``, ``ackers`` and ``coordinators``, each
    ``(handle, Ray name)``."""

    stages: list = field(default_factory=list)
    ackers: list = field(default_factory=list)
    coordinators: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stages) + len(self.ackers) + len(self.coordinators)

    def _all(self) -> list:
        return self.stages + self.ackers + self.coordinators

    def handles(self) -> list:
        return [h for h, _ in self._all()]

    def names(self) -> list:
        return [n for _, n in self._all()]

    def add(self, other: "WarmActors") -> None:
        """Append ``other``'s actors to these."""
        self.stages.extend(other.stages)
        self.ackers.extend(other.ackers)
        self.coordinators.extend(other.coordinators)

    def split(self, names: set) -> tuple:
        """``(those named in names, the rest)``, each a :class:`WarmActors`."""
        def pick(kept: bool) -> WarmActors:
            return WarmActors(*([a for a in kind if (a[1] in names) == kept] for kind in (self.stages, self.ackers, self.coordinators)))
        return pick(True), pick(False)

    def for_coordinator(self) -> "WarmActors":
        """The stage actors and ackers, which a coordinator's launch takes (not the coordinators)."""
        return WarmActors(self.stages, self.ackers)

    def take_acker(self) -> Optional[tuple]:
        """A warm acker ``(handle, name)`` out of the set, or None."""
        return self.ackers.pop(0) if self.ackers else None


def retire(handles: list, names: list, timeout_s: float = 10.0) -> list:
    """Retire the warm actors ``handles`` (each ends the instance it played, see
    ``StageActor.retire``), killing any that fails to or does not answer within ``timeout_s``;
    the names of those that retired."""
    refs = [h.retire.remote() for h in handles]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    retired, failed = [], []
    for ref, handle, name in zip(refs, handles, names):
        try:
            ray.get(ref, timeout=0)
            retired.append(name)
        except Exception:  # died with its flow, raised tearing it down, or hangs: no flow gets it again
            failed.append((handle, name))
    if failed:
        kill_actors([h for h, _ in failed], [n for _, n in failed], wait_s=0)
    return retired
