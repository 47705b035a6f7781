"""What each instance of a plan restores from a snapshot taken at another parallelism
(or by another layout of stages, e.g. a fused plan's at parallelism 1): key groups and
source partitions follow their owners, and a step's state its step, whichever stage runs it.

A part's state for a step is a list of *slices*: a participant's chain (base and
deltas in the store) restricted to the key groups ``[start, end)`` the new instance
owns. An old instance whose range falls wholly to one new instance gives it the slice
unrestricted (no ``groups``), so a restore at the same parallelism downloads the base
as it is. Source positions are per partition; a new source instance takes those of
the partitions it now reads. A snapshot from before key groups (manifest version 1)
gives every new instance every old participant, marked ``legacy``: its keys are
regrouped as they are read.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> from driftstream.engine.model.manifest import manifest_of
>>> flow = Flow("f", max_parallelism=6)
>>> flow.source(MemorySource([1], partitions=3), name="src").key_by(str, name="k").count(name="n").sink(MemorySink("o"))
>>> chain = lambda i: {"participant": f"f-k-{i}-n", "base": 7, "deltas": [8]}
>>> parts = {Instance(0, i): SnapshotPart(sources={str(i): [5, 5]}) for i in range(3)}
>>> parts.update({Instance(1, i): SnapshotPart(states={"n": chain(i)}) for i in range(3)})
>>> old = manifest_of(flow.plan(3), 8, (9,), parts, missing=[])    # groups 0-1, 2-3, 4-5
>>> new = reassign(old, flow.plan(2))                              # groups 0-2, 3-5
>>> new["1/0"].states["n"]
[{'participant': 'f-k-0-n', 'base': 7, 'deltas': [8]}, {'participant': 'f-k-1-n', 'base': 7, 'deltas': [8], 'groups': [2, 3]}]
>>> new["0/0"].sources, new["0/1"].sources
({'0': [5, 5], '2': [5, 5]}, {'1': [5, 5]})
>>> reassign(old, flow.plan(3)) == dict(old.parts)     # the same layout: every part as it is
True
>>> one = reassign(old, flow.plan(1))      # fused: one stage reads every partition, holds every group
>>> sorted(one), [s["participant"] for s in one["0/0"].states["n"]], sorted(one["0/0"].sources)
(['0/0'], ['f-k-0-n', 'f-k-1-n', 'f-k-2-n'], ['0', '1', '2'])
"""

from __future__ import annotations

from typing import Mapping, Optional

from driftstream.ordering.key_groups import GroupRange, KeyGroups

from driftstream.engine.model.manifest import Manifest, SnapshotPart, required_by, slices_of
from driftstream.engine.model.plan import Instance, Plan


def stage_names(manifest: Manifest, plan: Plan) -> tuple:
    """The names of the snapshot's stages by index (a version 1 manifest did not record them:
    the plan's, whose layout it must then have, a stage per key_by: it predates fused plans)."""
    return manifest.stages if manifest.stages is not None else tuple(s.name for s in plan.unfused().stages)


def same_layout(manifest: Manifest, plan: Plan) -> bool:
    """True when every part of ``manifest`` restores as it is into the instance of ``plan`` with its label."""
    return (not manifest.legacy and manifest.parallelism == plan.parallelism
            and manifest.stages == tuple(s.name for s in plan.stages))


def reassign(manifest: Manifest, plan: Plan, source_partitions: Optional[Mapping[str, int]] = None) -> dict:
    """Per instance label of ``plan``, its :class:`SnapshotPart` of ``manifest``: the slices of
    the key groups it owns, the positions of the partitions it reads. State of steps the plan
    no longer has is left out (only after :mod:`.manifest_fit` allowed that). O(parts x
    new instances per stage).

    ``source_partitions`` (a source's partition count now, by name): partitions the snapshot
    does not know (added since) start at their first offset, their running time just past the
    snapshot's, so that their elements come after everything it holds (a time below it would
    be taken for output the sinks already have)."""
    parts = dict(manifest.parts) if same_layout(manifest, plan) else _reassigned_parts(manifest, plan)
    if source_partitions:
        _add_new_partitions(parts, manifest, plan, source_partitions)
    return parts


def _reassigned_parts(manifest: Manifest, plan: Plan) -> dict:
    # A step's state follows the step, whichever stage holds it in either layout (a fused
    # plan runs a keyed step in its source's stage); read positions follow the source's
    # stage, named after the source in every layout.
    names = stage_names(manifest, plan)
    groups = KeyGroups(manifest.max_parallelism or plan.max_parallelism)
    stateful = set(plan.stateful_steps)
    old_by_stage: dict = {}
    old_states: dict = {}  # step name -> [(the key groups its participant held, its state)]
    for label, part in manifest.parts.items():
        stage, index = (int(x) for x in label.split("/"))
        held = None if manifest.legacy else groups.range_of(index, manifest.parallelism)
        old_by_stage.setdefault(names[stage], []).append(part)
        for step, state in part.states.items():
            old_states.setdefault(step, []).append((held, state))
    parts = {}
    for stage in plan.stages:
        old = old_by_stage.get(stage.name, []) if stage.source_id >= 0 else []
        steps = [step for step in stage.steps if step in stateful]
        for index in range(stage.parallelism):
            owned = groups.range_of(index, stage.parallelism)
            states: dict = {}
            sources: dict = {}
            for step in steps:
                for held, state in old_states.get(step, ()):
                    states.setdefault(step, []).extend(_cut(s, held, owned) for s in slices_of(state))
            for part in old:
                sources.update({p: pos for p, pos in part.sources.items() if int(p) % stage.parallelism == index})
            states = {step: sorted((s for s in slices if s is not None), key=lambda s: s["participant"]) for step, slices in states.items()}
            new = SnapshotPart(states={k: v for k, v in states.items() if v}, sources=dict(sorted(sources.items(), key=lambda kv: int(kv[0]))))
            if new:
                parts[Instance(stage.index, index).label] = new
    return parts


def _add_new_partitions(parts: dict, manifest: Manifest, plan: Plan, source_partitions: Mapping[str, int]) -> None:
    t = manifest.t
    after = t[0] + 1 if t and isinstance(t[0], int) else None
    for stage in plan.stages:
        if stage.source_id < 0:
            continue
        labels = [Instance(stage.index, i).label for i in range(stage.parallelism)]
        held = {int(p) for label in labels for p in parts.get(label, SnapshotPart()).sources}
        if not held:
            continue  # a source the snapshot does not know at all reads from its start
        for p in range(source_partitions.get(stage.name, 0)):
            if p not in held:
                label = labels[p % stage.parallelism]
                old = parts.get(label, SnapshotPart())
                parts[label] = SnapshotPart(states=old.states, sources={**old.sources, str(p): [0, after]})


def reassigned(manifest: Manifest, plan: Plan, snapshot_id: int, source_partitions: Optional[Mapping[str, int]] = None) -> Manifest:
    """``manifest`` as a manifest of ``plan``, committed as ``snapshot_id`` (it writes no state
    files: its parts read the old ones, which it requires). The run's counts below its T go
    with it: the rescaled incarnation counts only what it settles from there."""
    parts = reassign(manifest, plan, source_partitions)
    return Manifest(
        snapshot_id=snapshot_id, flow=plan.flow_name, parallelism=plan.parallelism, t=manifest.t, parts=parts,
        requires=required_by(parts.values(), snapshot_id), max_parallelism=plan.max_parallelism,
        stateful_steps=tuple(plan.stateful_steps), stages=tuple(s.name for s in plan.stages), key_hash=plan.key_groups.key_hash,
        counts=manifest.counts)


def _cut(slice_: dict, held: Optional[GroupRange], owned: GroupRange) -> Optional[dict]:
    """The part of ``slice_`` (of a participant that held ``held``; None: unknown, a version 1
    snapshot) in ``owned``; None if nothing."""
    if held is None or slice_.get("legacy"):
        limit = GroupRange(*slice_["groups"]) if "groups" in slice_ else owned
        taken = limit.overlap(owned)
        return {**slice_, "groups": list(taken), "legacy": True} if len(taken) else None
    has = GroupRange(*slice_["groups"]) if "groups" in slice_ else held
    taken = has.overlap(owned)
    if not len(taken):
        return None
    if taken == held and "groups" not in slice_:
        return dict(slice_)  # all the participant holds: restored as it is
    return {**slice_, "groups": list(taken)}
