"""What a committed snapshot records: one :class:`SnapshotPart` per stage instance,
gathered into a :class:`Manifest`, and the rules that turn the parts of snapshot T
into a manifest (:func:`manifest_of`).

A stage instance is named by an :class:`Instance`, ``(stage, index)``; in a manifest
(JSON, whose keys are strings) by its :attr:`Instance.label`, ``"stage/index"``.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> flow = Flow("wc"); flow.source(MemorySource([1]), name="src").key_by(str, name="k").count(name="n").sink(MemorySink("o"))
>>> part = SnapshotPart(states={}, sources={"0": [7, 7]})
>>> m = manifest_of(flow.plan(2), 5, (7, 0, 0, 7), {Instance(0, 0): part, Instance(1, 0): SnapshotPart()}, missing=[])
>>> m.snapshot_id, m.part(Instance(0, 0)).positions(), m.part(Instance(1, 0)) == SnapshotPart()
(5, {0: (7, 7)}, True)
>>> m.version, m.max_parallelism, m.stateful_steps, m.stages
(2, 128, ('n',), ('src', 'k'))
>>> Manifest.from_json(m.to_json()) == m
True

Version 1 (before key groups) had no ``version``, ``max_parallelism``, ``stateful_steps``
nor ``stages``; it reads as a manifest whose fields say so (``version=1``, the others None),
and its state restores through :mod:`.reassignment` (every key re-grouped as it is read).

A part's state for a step is one *slice* of a participant's chain (a dict:
``participant``, ``base``, ``deltas``), or a list of slices each restricted to
``groups`` (``[start, end]``) when a change of parallelism gave the instance groups that
several old instances held (see :mod:`.reassignment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from driftstream.snapshots.changelog import snapshots_required

from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.run_counts import ZERO, RunCounts

#: The manifest format this build writes; it reads this one and version 1.
MANIFEST_VERSION = 2


@dataclass(frozen=True)
class SnapshotPart:
    """One stage instance's part of a snapshot, sent to the acker once durable.

    ``states``: step name -> its chain entry (:meth:`driftstream.snapshots.changelog.Chain.entry`),
    or a list of slices of chains (see the module doc and :func:`slices_of`);
    ``sources``: partition number (a str, as in JSON) -> ``[offset, running ts]``, where a
    replay from the snapshot's T starts; ``error``: why the part could not be written;
    ``counts``: what the instance's sinks settled below T in its incarnation (None: not
    counted), summed into :attr:`Manifest.counts`, not stored with the part.
    """

    states: Mapping[str, dict] = field(default_factory=dict)
    sources: Mapping[str, list] = field(default_factory=dict)
    error: Optional[str] = None
    counts: Optional[RunCounts] = None

    def positions(self) -> Optional[dict]:
        """The source positions as a reader takes them (``{partition: (offset, ts)}``), None if none."""
        return {int(p): tuple(pos) for p, pos in self.sources.items()} or None

    def __bool__(self) -> bool:
        return bool(self.states or self.sources or self.error)


def slices_of(state: Any) -> list:
    """The slices of a part's state for one step: a chain entry is one slice, of all its groups.

    >>> slices_of({"participant": "f-k-0-n", "base": 3, "deltas": []})
    [{'participant': 'f-k-0-n', 'base': 3, 'deltas': []}]
    """
    return [state] if isinstance(state, dict) else list(state)


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
    sources, and the older snapshots whose files those parts build on (``requires``).

    What the flow was when it was taken, for :mod:`.manifest_fit`: ``max_parallelism``, the
    names of its stateful steps and of its stages (by index, as in part labels); None in a
    version 1 manifest, which did not record them."""

    snapshot_id: int
    flow: str
    parallelism: int
    t: tuple
    parts: Mapping[str, SnapshotPart]
    requires: tuple = ()
    version: int = MANIFEST_VERSION
    max_parallelism: Optional[int] = None
    stateful_steps: Optional[tuple] = None
    stages: Optional[tuple] = None
    #: how keys were hashed to their groups (:data:`~driftstream.ordering.key_groups.KEY_HASH`):
    #: a flow resumed from this snapshot keeps it; 1 in manifests written before it was recorded
    key_hash: Optional[int] = None
    #: the run's output and dead letters below T, over its recoveries (see :mod:`.run_counts`);
    #: None in a manifest written before they were kept, or when an instance did not count
    counts: Optional[RunCounts] = None

    def part(self, instance: Instance) -> SnapshotPart:
        """What ``instance`` restores from (an empty part if it had nothing to record)."""
        return self.parts.get(instance.label, SnapshotPart())

    def offsets(self, instances: Iterable[Instance]) -> dict:
        """``{partition: offset}`` where a replay of the partitions these (source) instances
        read starts: the next record to read of each."""
        return {p: pos[0] for i in instances for p, pos in (self.part(i).positions() or {}).items()}

    @property
    def legacy(self) -> bool:
        """Written before key groups: its state is keyed without groups, its keys routed by hash modulo parallelism."""
        return self.version < 2

    def to_json(self) -> dict:
        data = {
            "version": self.version,
            "snapshot_id": self.snapshot_id,
            "flow": self.flow,
            "parallelism": self.parallelism,
            "t": list(self.t),
            "parts": {label: {"states": dict(p.states), "sources": dict(p.sources)} for label, p in self.parts.items()},
            "requires": list(self.requires),
            # which of those are bases: the store keeps a manifest before each (see SnapshotStore.prune)
            "bases": bases_of(self.parts.values()),
        }
        if self.counts is not None:
            data["counts"] = self.counts.to_json()
        if not self.legacy:
            data.update(max_parallelism=self.max_parallelism, stateful_steps=list(self.stateful_steps), stages=list(self.stages),
                        key_hash=self.key_hash)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Manifest":
        """The manifest ``data`` (from the store); a version this build does not know raises
        :class:`UnknownManifestVersion`."""
        version = data.get("version", 1)
        if version not in (1, MANIFEST_VERSION):
            raise UnknownManifestVersion(
                f"snapshot {data.get('snapshot_id')} has manifest version {version!r}; this build reads versions 1 and "
                f"{MANIFEST_VERSION}: resume it with the driftstream release that wrote it, or start afresh (fresh=True)")
        optional = lambda name: tuple(data[name]) if data.get(name) is not None else None  # noqa: E731
        return cls(
            snapshot_id=data["snapshot_id"],
            flow=data["flow"],
            parallelism=data["parallelism"],
            t=tuple(data["t"]),
            parts={label: SnapshotPart(p["states"], p["sources"]) for label, p in data["parts"].items()},
            requires=tuple(data.get("requires", ())),
            version=version,
            max_parallelism=data.get("max_parallelism"),
            stateful_steps=optional("stateful_steps"),
            stages=optional("stages"),
            key_hash=data.get("key_hash") or (1 if version >= 2 else None),
            counts=RunCounts.from_json(data.get("counts")),
        )


class UnknownManifestVersion(ValueError):
    """A manifest written by a newer build."""


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


def committed_t(t: tuple, restored: Optional["Manifest"]) -> tuple:
    """The T a snapshot at watermark ``t`` is committed at, in an incarnation restored from
    ``restored``: at least the restored T. A new incarnation's acker starts again from the
    bottom, so a snapshot taken before its watermark climbs back holds the restored state and
    nothing more, which is the restored snapshot's, at its T; committed at ``t`` instead, a
    restore from it set the timers of windows emitted below that T again (a window emitted
    twice after a crash while a rescale drained).

    >>> committed_t((3,), None), committed_t((float("-inf"),), Manifest(1, "f", 2, (7,), {})), committed_t((9,), Manifest(1, "f", 2, (7,), {}))
    ((3,), (7,), (9,))
    """
    return tuple(t) if restored is None else max(tuple(t), tuple(restored.t))


def manifest_of(plan: Plan, snapshot_id: int, t: tuple, parts: Mapping[Instance, SnapshotPart], missing: Iterable,
                restored: Optional[Manifest] = None) -> Manifest:
    """The manifest of snapshot ``snapshot_id`` of a run of ``plan`` at ``t`` from every instance's part;
    ``restored``: the manifest the incarnation started from, whose counts the new ones add to.

    Raises :class:`MissingParts` if an instance did not answer, :class:`SnapshotFailed`
    if one could not write its part: such a snapshot is never committed."""
    missing = [Instance(*k) for k in missing]
    if missing:
        raise MissingParts(missing)
    errors = [f"{Instance(*k).label}: {p.error}" for k, p in parts.items() if p.error]
    if errors:
        raise SnapshotFailed(f"snapshot {snapshot_id} failed: {'; '.join(errors)}")
    counts = total_counts(parts.values(), restored)
    parts = {Instance(*k).label: p for k, p in sorted(parts.items()) if p}
    return Manifest(
        snapshot_id=snapshot_id,
        flow=plan.flow_name,
        parallelism=plan.parallelism,
        t=tuple(t),
        parts=parts,
        requires=required_by(parts.values(), snapshot_id),
        max_parallelism=plan.max_parallelism,
        stateful_steps=tuple(plan.stateful_steps),
        stages=tuple(stage.name for stage in plan.stages),
        key_hash=plan.key_groups.key_hash,
        counts=counts,
    )


def total_counts(parts: Iterable[SnapshotPart], restored: Optional[Manifest]) -> Optional[RunCounts]:
    """The run's counts below a snapshot's T: the restored manifest's (none: zero) plus each
    part's; None if a part was not counted.

    >>> total_counts([SnapshotPart(counts=RunCounts({"o": 2})), SnapshotPart(counts=ZERO)], None)
    RunCounts(released={'o': 2}, dead_letters={})
    >>> total_counts([SnapshotPart()], None) is None
    True
    """
    total = ZERO if restored is None or restored.counts is None else restored.counts
    for part in parts:
        if part.counts is None:
            return None
        total = total + part.counts
    return total


def bases_of(parts: Iterable[SnapshotPart]) -> list:
    """The snapshots holding the bases of ``parts``' chains, ascending (a part's own snapshot
    among them when it wrote a base).

    >>> bases_of([SnapshotPart(states={"n": {"participant": "p", "base": 3, "deltas": [4]}}),
    ...           SnapshotPart(states={"n": [{"participant": "q", "base": 5, "deltas": []}]})])
    [3, 5]
    """
    return sorted({s["base"] for p in parts for state in p.states.values() for s in slices_of(state) if s.get("base") is not None})


def required_by(parts: Iterable[SnapshotPart], snapshot_id: int) -> tuple:
    """The older snapshots whose files ``parts`` read (not ``snapshot_id`` itself), ascending."""
    required = {i for p in parts for state in p.states.values() for s in slices_of(state) for i in snapshots_required(s)}
    return tuple(sorted(required - {snapshot_id}))
