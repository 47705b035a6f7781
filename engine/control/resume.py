"""Where a run starts: the snapshot it resumes from, checked against its flow, and at which
parallelism. Nothing is restored, or wiped, silently.

- Without ``resume``: a snapshot directory holding committed snapshots is refused, the
  flow's own as another's: a start from the beginning would discard them and replay all the
  input into sinks that may hold its output already. ``fresh=True`` discards them (a
  WARNING says how many), ``resume=True`` continues from the newest.
- With ``resume``: the newest snapshot must fit the flow (:mod:`~driftstream.engine.model.manifest_fit`).
  At the snapshot's parallelism and layout the run restores it as it is. At another, its
  key groups and partitions are reassigned (:mod:`~driftstream.engine.model.reassignment`)
  and the result is committed as a new snapshot before anything starts, so that a failure
  from then on restores at the new parallelism, whose routing wrote any output past it.

Reassigning is exact only if the sinks hold no output at or past the snapshot's time: the
replay would route it to other sink partitions, whose ``t_last`` says nothing of it. A stop
(or a rescale) leaves the sinks so (its snapshot is drained, see :mod:`.rescaler`); a crash
does not. Then the run resumes at the snapshot's parallelism, replays what the sinks
hold, and rescales once it has caught up (``rescale_to``).

>>> start = StartPoint(manifest=None, plan=flow.plan(2))    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Optional

from driftstream.snapshots.output_segments import discard_outputs
from driftstream.snapshots.store import SnapshotStore

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest_fit import SnapshotMismatch, check_fit, snapshot_partitions
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.reassignment import reassigned, same_layout
from driftstream.engine.model.recovery import RecoveryRules

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartPoint:
    """What a run launches: ``plan`` from ``manifest`` (None: from the beginning), and
    ``rescale_to``: the parallelism to move to once the replay has caught up with the sinks
    (None: it runs at ``plan``'s)."""

    manifest: Optional[Manifest]
    plan: Plan
    rescale_to: Optional[int] = None


def start_point(plan: Plan, config: RunConfig, rules: RecoveryRules, store: Optional[SnapshotStore], next_id: int) -> StartPoint:
    """Where ``plan``'s run starts under ``config`` (see the module doc); ``next_id``: the
    snapshot id a reassigned manifest is committed as. Raises :class:`SnapshotMismatch` (a
    FlowError) before anything starts."""
    if store is None:
        return StartPoint(None, plan)
    if config.fresh:  # whatever the directory holds, even manifests that cannot be read
        _discard(plan, store)
        return StartPoint(None, plan)
    data = store.read_latest_manifest()
    manifest = None if data is None else Manifest.from_json(data)
    if not config.resume:
        _start_afresh(plan, store, manifest)
        return StartPoint(None, plan)
    if manifest is None:
        return StartPoint(None, plan)
    if config.keep_parallelism and not manifest.legacy and manifest.parallelism != plan.parallelism:
        plan = plan.with_parallelism(manifest.parallelism)
    if not manifest.legacy and manifest.key_hash != plan.key_groups.key_hash:
        log.info("flow %s keeps key hash %s, the one its snapshot %d stored state with", plan.flow_name, manifest.key_hash, manifest.snapshot_id)
        plan = plan.with_key_hash(manifest.key_hash)
    partitions = source_partitions(plan)
    check_fit(manifest, plan, config, partitions)
    known = snapshot_partitions(manifest, plan)
    grown = any(partitions.get(name, 0) > len(held) for name, held in known.items())
    if same_layout(manifest, plan) and not grown:
        return StartPoint(manifest, plan)
    rerouted = manifest.legacy or manifest.parallelism != plan.parallelism
    if rerouted and rules.drops_released:
        horizon = sink_horizon(plan, manifest.parallelism)
        if horizon is not None and horizon >= manifest.t:
            if manifest.legacy:
                raise SnapshotMismatch(
                    f"snapshot {manifest.snapshot_id} was written before key groups (manifest version 1), and the sinks hold "
                    f"output past it (up to t={horizon!r}): a replay routed by key groups would send that output again to "
                    "other sink partitions. Resume it with the driftstream release that wrote it, stop the flow there (a "
                    "final snapshot), then resume with this one; or resume with guarantee='at-least-once'")
            log.warning("flow %s: the sinks hold output past snapshot %d (the flow was not stopped); resuming at its "
                        "parallelism %d, then rescaling to %d once the replay has caught up",
                        plan.flow_name, manifest.snapshot_id, manifest.parallelism, plan.parallelism)
            old = plan.with_parallelism(manifest.parallelism)
            if not same_layout(manifest, old) or grown:
                manifest = _commit(store, reassigned(manifest, old, next_id, partitions))
            return StartPoint(manifest, old, rescale_to=plan.parallelism)
    log.info("flow %s resumes snapshot %d (parallelism %d) at parallelism %d: key groups and partitions reassigned as snapshot %d",
             plan.flow_name, manifest.snapshot_id, manifest.parallelism, plan.parallelism, next_id)
    return StartPoint(_commit(store, reassigned(manifest, plan, next_id, partitions)), plan)


def _commit(store: SnapshotStore, manifest: Manifest) -> Manifest:
    store.write_manifest(manifest.snapshot_id, manifest.to_json())
    return manifest


def _start_afresh(plan: Plan, store: SnapshotStore, manifest: Optional[Manifest]) -> None:
    """A start from the beginning without ``fresh``: refused over committed snapshots (the
    newest is ``manifest``); uncommitted leftovers go."""
    if manifest is not None and manifest.flow != plan.flow_name:
        raise SnapshotMismatch(
            f"the snapshot directory {store.uri} holds snapshots of flow {manifest.flow!r} (the newest: {manifest.snapshot_id}); "
            f"starting flow {plan.flow_name!r} there would discard them. Give {plan.flow_name!r} its own snapshot_dir, or "
            "start with fresh=True (--fresh) to discard them")
    if manifest is not None:
        raise FlowError(
            f"flow {plan.flow_name!r} has snapshots in {store.uri} (the newest: {manifest.snapshot_id}); "
            "a start from the beginning would discard them and replay all its input into sinks that may already hold its "
            "output (duplicates). Start with resume=True (--resume) to continue from the newest snapshot, or with "
            "fresh=True (--fresh) to discard the snapshots and start from the beginning (the sinks keep what they hold)")
    for sid in store.snapshot_ids():
        store.delete_snapshot(sid)
    discard_outputs(store)  # a run from the beginning must not replay another's logged outputs


def _discard(plan: Plan, store: SnapshotStore) -> None:
    """``fresh=True``: every snapshot in ``store`` goes, committed or not, this flow's or another's."""
    ids, committed = store.snapshot_ids(), store.committed_ids()
    if committed:
        log.warning("flow %s starts from the beginning (fresh=True): discarding %d snapshots in %s, %d of them committed "
                    "(the newest: %d)", plan.flow_name, len(ids), store.uri, len(committed), committed[-1])
    for sid in ids:
        store.delete_snapshot(sid)
    discard_outputs(store)


def check_sources(plan: Plan) -> None:
    """On the driver, before any actor starts: each source's ``partitions()`` (a Kafka topic
    exists, a PostgreSQL publication and slot exist or are made), so that what is missing
    fails within a second with the connector's own error, not as an actor that could not
    start. Asks a copy: the flow's sources keep no answer (a topic may grow before a later run)."""
    for stage in plan.stages:
        if stage.source_id >= 0:
            step = plan.steps[stage.source_id]
            try:
                copy.copy(step.source).partitions()
            except Exception as exc:
                exc.add_note(f"(source {step.name!r} of flow {plan.flow_name!r}, checked before the run started)")
                raise


def source_partitions(plan: Plan) -> dict:
    """Each source's partition count now, by its name (a Kafka source asks the broker)."""
    return {stage.name: plan.steps[stage.source_id].source.partitions() for stage in plan.stages if stage.source_id >= 0}


def sink_horizon(plan: Plan, parallelism: int) -> Optional[tuple]:
    """The latest ``t_last`` over the partitions a run at ``parallelism`` wrote of each sink:
    the newest output the sinks hold (None: nothing, or sinks that cannot tell)."""
    lasts = []
    for step in plan.steps:
        if not step.kind.is_sink:
            continue
        for i in range(parallelism):
            partition = step.sink.open(i, parallelism)
            try:
                lasts.append(partition.t_last())
            finally:
                partition.close()
    known = [tuple(t) for t in lasts if t is not None]
    return max(known) if known else None


def check_sinks(plan: Plan) -> None:
    """Before any actor of ``plan`` starts: every sink can take its parallelism (a Kafka topic
    with fewer partitions is refused, with what to do)."""
    for step in plan.steps:
        if step.kind.is_sink:
            try:
                step.sink.check(plan.stages[plan.stage_of[step.id]].parallelism)
            except ValueError as exc:
                raise FlowError(f"sink {step.name!r}: {exc}") from None
