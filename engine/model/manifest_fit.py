"""Whether a snapshot fits the flow about to resume from it; a refusal says what to do.

Nothing is ever restored, or wiped, silently (DESIGN.md, "Key groups and rescaling"): a
snapshot of another flow, another ``max_parallelism``, state for steps the flow does
not have (or stateful steps the snapshot does not know), a source whose partitions
changed: each is a :class:`SnapshotMismatch` naming the snapshot, the difference, and
the option that accepts it where one does (``allow_state_changes``,
``allow_new_partitions``). Steps are matched by name, as Flink matches operators by uid.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.model.manifest import manifest_of, SnapshotPart
>>> def flow(name, step):
...     f = Flow(name); f.source(MemorySource([1]), name="src").key_by(str, name="k").count(name=step).sink(MemorySink("o"))
...     return f.plan(2)
>>> parts = {Instance(0, 0): SnapshotPart(sources={"0": [7, 7]}),
...          Instance(1, 0): SnapshotPart(states={"n": {"participant": "f-k-0-n", "base": 3, "deltas": []}})}
>>> m = manifest_of(flow("f", "n"), 4, (9,), parts, missing=[])
>>> check_fit(m, flow("f", "n"), RunConfig(resume=True), {"src": 1})
>>> check_fit(m, flow("g", "n"), RunConfig(resume=True), {"src": 1})
Traceback (most recent call last):
...
driftstream.engine.model.manifest_fit.SnapshotMismatch: snapshot 4 in the snapshot directory is of flow 'f', not 'g': give flow 'g' its own snapshot_dir, or start it with fresh=True to discard these snapshots
>>> check_fit(m, flow("f", "total"), RunConfig(resume=True), {"src": 1})
Traceback (most recent call last):
...
driftstream.engine.model.manifest_fit.SnapshotMismatch: snapshot 4 does not fit flow 'f': it holds state of step 'n', which the flow no longer has (it would be dropped); the flow's stateful step 'total' is not in the snapshot (it would start empty). Steps are matched by name: give a step its old name= to keep its state, or resume with allow_state_changes=True to accept this
"""

from __future__ import annotations

from typing import Mapping

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance, Plan  # noqa: F401  (Instance: the doctest)
from driftstream.engine.model.reassignment import stage_names


class SnapshotMismatch(FlowError):
    """The snapshot a run would resume from does not fit its flow (nothing has started)."""


def check_fit(manifest: Manifest, plan: Plan, config: RunConfig, source_partitions: Mapping[str, int]) -> None:
    """Raise :class:`SnapshotMismatch` unless ``plan`` may resume from ``manifest`` under
    ``config``. ``source_partitions``: each source step's partition count now. O(parts)."""
    sid = manifest.snapshot_id
    if manifest.flow != plan.flow_name:
        raise SnapshotMismatch(
            f"snapshot {sid} in the snapshot directory is of flow {manifest.flow!r}, not {plan.flow_name!r}: give flow "
            f"{plan.flow_name!r} its own snapshot_dir, or start it with fresh=True to discard these snapshots")
    if not manifest.legacy and manifest.max_parallelism != plan.max_parallelism:
        raise SnapshotMismatch(
            f"snapshot {sid} was taken with max_parallelism={manifest.max_parallelism}, and flow {plan.flow_name!r} has "
            f"{plan.max_parallelism}: keyed state is stored in max_parallelism key groups, so it restores only into the same "
            f"number. Build the flow with Flow({plan.flow_name!r}, max_parallelism={manifest.max_parallelism}), or start "
            "afresh with fresh=True")
    problems = _state_changes(manifest, plan)
    if problems and not config.allow_state_changes:
        raise SnapshotMismatch(
            f"snapshot {sid} does not fit flow {plan.flow_name!r}: {'; '.join(problems)}. Steps are matched by name: give a "
            "step its old name= to keep its state, or resume with allow_state_changes=True to accept this")
    _check_sources(manifest, plan, config, source_partitions)


def _state_changes(manifest: Manifest, plan: Plan) -> list:
    held = {step for part in manifest.parts.values() for step in part.states}
    known = held if manifest.stateful_steps is None else held | set(manifest.stateful_steps)
    now = plan.stateful_steps
    problems = [f"it holds state of step {s!r}, which the flow no longer has (it would be dropped)" for s in sorted(held - set(now))]
    if manifest.stateful_steps is not None:  # a version 1 manifest named only the steps that had state
        problems += [f"the flow's stateful step {s!r} is not in the snapshot (it would start empty)" for s in now if s not in known]
    return problems


def snapshot_partitions(manifest: Manifest, plan: Plan) -> dict:
    """Per source stage name: the partitions the snapshot holds positions of."""
    names = stage_names(manifest, plan)
    out: dict = {}
    for label, part in manifest.parts.items():
        if part.sources:
            out.setdefault(names[int(label.split("/")[0])], set()).update(int(p) for p in part.sources)
    return out


def _check_sources(manifest: Manifest, plan: Plan, config: RunConfig, source_partitions: Mapping[str, int]) -> None:
    sid, held = manifest.snapshot_id, snapshot_partitions(manifest, plan)
    sources = {plan.steps[s.source_id].name for s in plan.stages if s.source_id >= 0}
    for name in sorted(set(held) - sources):
        if not config.allow_state_changes:
            raise SnapshotMismatch(
                f"snapshot {sid} holds the read positions of source {name!r}, which flow {plan.flow_name!r} no longer has: "
                "give the source its old name=, or resume with allow_state_changes=True to drop them")
    for name in sorted(sources):
        had, has = held.get(name), source_partitions.get(name)
        if had is None:
            if not config.allow_state_changes:
                raise SnapshotMismatch(
                    f"source {name!r} of flow {plan.flow_name!r} is not in snapshot {sid} (it would be read from its start): "
                    "give it the name= of the source it replaces, or resume with allow_state_changes=True")
            continue
        if has is None:
            continue
        if has < len(had) or max(had) >= has:
            raise SnapshotMismatch(
                f"source {name!r} has {has} partitions, and snapshot {sid} holds read positions for {len(had)} (up to partition "
                f"{max(had)}): a partition it read is gone, and what it held would be lost. Resume it from the input it was "
                "taken of, or start afresh with fresh=True")
        if has > len(had) and not config.allow_new_partitions:
            added = sorted(set(range(has)) - had)
            raise SnapshotMismatch(
                f"source {name!r} has {has} partitions, and snapshot {sid} knows {len(had)}: partitions {added} were added since. "
                "Resume with allow_new_partitions=True to read them from their start (their times then come after nothing "
                "the snapshot holds, so the rest of the output is unchanged)")
