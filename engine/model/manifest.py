"""What a committed snapshot records: one :class:`SnapshotPart` per stage instance,
gathered into a :class:`Manifest`, and the rules that turn the parts of snapshot T
into a manifest (:func:`manifest_of`).

A stage instance is named by an :class:`Instance`, ``(stage, index)``; in a manifest
(JSON, whose keys are strings) by its :attr:`Instance.label`, ``"stage/index"``.

>>> part = SnapshotPart(states={}, sources={"0": [7, 7]})
>>> m = manifest_of("wc", 2, 5, (7, 0, 0, 7), {Instance(0, 0): part, Instance(1, 0): SnapshotPart()}, missing=[])
>>> m.snapshot_id, m.part(Instance(0, 0)).positions(), m.part(Instance(1, 0)) == SnapshotPart()
(5, {0: (7, 7)}, True)
>>> Manifest.from_json(m.to_json()) == m
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from driftstream.snapshots.changelog import snapshots_required

from driftstream.engine.model.plan import Instance


@dataclass(frozen=True)
class SnapshotPart:
    """One stage instance's part of a snapshot, sent to the acker once durable.

    ``states``: step name -> its chain entry (:meth:`driftstream.snapshots.changelog.Chain.entry`);
    ``sources``: partition number (a str, as in JSON) -> ``[offset, running ts]``, where a
    replay from the snapshot's T starts; ``error``: why the part could not be written.
    """

    states: Mapping[str, dict] = field(default_factory=dict)
    sources: Mapping[str, list] = field(default_factory=dict)
    error: Optional[str] = None

    def positions(self) -> Optional[dict]:
        """The source positions as a reader takes them (``{partition: (offset, ts)}``), None if none."""
        return {int(p): tuple(pos) for p, pos in self.sources.items()} or None

    def __bool__(self) -> bool:
        return bool(self.states or self.sources or self.error)


class MissingParts(Exception):
    """Instances that did not answer a snapshot in time (they hang)."""

    def __init__(self, instances: Iterable[Instance]) -> None:
        self.instances = sorted(instances)
        super().__init__(f"no snapshot part from instances {[i.label for i in self.instances]}")


class SnapshotFailed(RuntimeError):
    """A part could not be written (the store failed); the snapshot is not committed."""


@dataclass(frozen=True)
class Manifest:
    """A committed snapshot: at watermark ``t``, the part of every instance that has state or
    sources, and the older snapshots whose files those parts build on (``requires``)."""

    snapshot_id: int
    flow: str
    parallelism: int
    t: tuple
    parts: Mapping[str, SnapshotPart]
    requires: tuple = ()

    def part(self, instance: Instance) -> SnapshotPart:
        """What ``instance`` restores from (an empty part if it had nothing to record)."""
        return self.parts.get(instance.label, SnapshotPart())

    def offsets(self, instances: Iterable[Instance]) -> dict:
        """``{partition: offset}`` where a replay of the partitions these (source) instances
        read starts: the next record to read of each."""
        return {p: pos[0] for i in instances for p, pos in (self.part(i).positions() or {}).items()}

    def to_json(self) -> dict:
        return {
            "snapshot_id": self.snapshot_id,
            "flow": self.flow,
            "parallelism": self.parallelism,
            "t": list(self.t),
            "parts": {label: {"states": dict(p.states), "sources": dict(p.sources)} for label, p in self.parts.items()},
            "requires": list(self.requires),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Manifest":
        return cls(
            snapshot_id=data["snapshot_id"],
            flow=data["flow"],
            parallelism=data["parallelism"],
            t=tuple(data["t"]),
            parts={label: SnapshotPart(p["states"], p["sources"]) for label, p in data["parts"].items()},
            requires=tuple(data.get("requires", ())),
        )


class PartCollector:
    """The parts of snapshot ``snapshot_id`` at ``t`` as they arrive, until every one of
    ``instances`` has answered (the acker keeps one per snapshot it is taking).

    >>> c = PartCollector(3, (9,), [Instance(0, 0), Instance(0, 1)])
    >>> c.add(Instance(0, 1), SnapshotPart()), c.missing
    (False, [Instance(stage=0, index=0)])
    >>> c.add(Instance(0, 0), SnapshotPart()), c.missing
    (True, [])
    """

    def __init__(self, snapshot_id: int, t: tuple, instances: Iterable[Instance]) -> None:
        self.snapshot_id = snapshot_id
        self.t = t
        self.instances = list(instances)
        self.parts: dict = {}

    def add(self, instance: Instance, part: SnapshotPart) -> bool:
        """Record ``instance``'s part; True once every instance has answered."""
        self.parts[Instance(*instance)] = part
        return len(self.parts) == len(self.instances)

    @property
    def missing(self) -> list:
        return [i for i in self.instances if i not in self.parts]


def manifest_of(flow: str, parallelism: int, snapshot_id: int, t: tuple, parts: Mapping[Instance, SnapshotPart], missing: Iterable) -> Manifest:
    """The manifest of snapshot ``snapshot_id`` at ``t`` from every instance's part.

    Raises :class:`MissingParts` if an instance did not answer, :class:`SnapshotFailed`
    if one could not write its part: such a snapshot is never committed."""
    missing = [Instance(*k) for k in missing]
    if missing:
        raise MissingParts(missing)
    errors = [f"{Instance(*k).label}: {p.error}" for k, p in parts.items() if p.error]
    if errors:
        raise SnapshotFailed(f"snapshot {snapshot_id} failed: {'; '.join(errors)}")
    requires = {i for p in parts.values() for e in p.states.values() for i in snapshots_required(e)} - {snapshot_id}
    return Manifest(
        snapshot_id=snapshot_id,
        flow=flow,
        parallelism=parallelism,
        t=tuple(t),
        parts={Instance(*k).label: p for k, p in sorted(parts.items()) if p},
        requires=tuple(sorted(requires)),
    )
