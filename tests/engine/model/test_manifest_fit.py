"""A snapshot must fit the flow that resumes from it: each difference is refused with what to
do, or accepted by its explicit option; a version 1 manifest (before key groups) still reads."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.manifest import Manifest, SnapshotPart, UnknownManifestVersion, manifest_of
from driftstream.engine.model.manifest_fit import SnapshotMismatch, check_fit
from driftstream.engine.model.plan import Instance
from driftstream.engine.testing import MemorySink, MemorySource

RESUME = RunConfig(resume=True)


def _plan(name="f", steps=("n",), partitions=2, parallelism=2, max_parallelism=128, source="src"):
    flow = Flow(name, max_parallelism=max_parallelism)
    s = flow.source(MemorySource([1], partitions=partitions), name=source)
    for i, step in enumerate(steps):
        s = s.key_by(str, name=f"k{i}" if i else "k").count(name=step)
    s.sink(MemorySink("o"))
    return flow.plan(parallelism)


def _manifest(plan, partitions=2):
    parts = {Instance(0, i): SnapshotPart(sources={str(p): [p, p] for p in range(partitions) if p % plan.parallelism == i})
             for i in range(plan.parallelism)}
    for stage in plan.stages[1:]:
        for i in range(plan.parallelism):
            parts[Instance(stage.index, i)] = SnapshotPart(states={s: {"participant": f"x-{i}-{s}", "base": 1, "deltas": []}
                                                                   for s in stage.steps if s in plan.stateful_steps})
    return Manifest.from_json(manifest_of(plan, 3, (9,), parts, missing=[]).to_json())


def test_the_same_flow_fits_at_any_parallelism():
    m = _manifest(_plan())
    for n in (1, 2, 3, 128):
        check_fit(m, _plan(parallelism=n), RESUME, {"src": 2})


def test_another_flows_snapshots_are_refused():
    with pytest.raises(SnapshotMismatch, match="snapshot 3 in the snapshot directory is of flow 'f', not 'g'.*fresh=True"):
        check_fit(_manifest(_plan()), _plan(name="g"), RESUME, {"src": 2})


def test_another_max_parallelism_is_refused():
    with pytest.raises(SnapshotMismatch, match=r"max_parallelism=128, and flow 'f' has 64.*Flow\('f', max_parallelism=128\)"):
        check_fit(_manifest(_plan()), _plan(max_parallelism=64), RESUME, {"src": 2})


def test_a_dropped_or_new_stateful_step_is_refused_unless_allowed():
    m = _manifest(_plan(steps=("n", "m")))
    with pytest.raises(SnapshotMismatch, match="it holds state of step 'm', which the flow no longer has.*allow_state_changes=True"):
        check_fit(m, _plan(steps=("n",)), RESUME, {"src": 2})
    with pytest.raises(SnapshotMismatch, match="stateful step 'total' is not in the snapshot \\(it would start empty\\)"):
        check_fit(m, _plan(steps=("n", "m", "total")), RESUME, {"src": 2})
    check_fit(m, _plan(steps=("n", "total")), RunConfig(resume=True, allow_state_changes=True), {"src": 2})


def test_a_renamed_source_is_refused_unless_allowed():
    m = _manifest(_plan())
    with pytest.raises(SnapshotMismatch, match="holds the read positions of source 'src', which flow 'f' no longer has"):
        check_fit(m, _plan(source="events"), RESUME, {"events": 2})


def test_added_partitions_are_refused_unless_allowed_and_removed_ones_always():
    m = _manifest(_plan())
    with pytest.raises(SnapshotMismatch, match=r"source 'src' has 4 partitions, and snapshot 3 knows 2: partitions \[2, 3\] were added.*"
                                               "allow_new_partitions=True"):
        check_fit(m, _plan(partitions=4), RESUME, {"src": 4})
    check_fit(m, _plan(partitions=4), RunConfig(resume=True, allow_new_partitions=True), {"src": 4})
    with pytest.raises(SnapshotMismatch, match="source 'src' has 1 partitions, and snapshot 3 holds read positions for 2"):
        check_fit(m, _plan(partitions=1), RunConfig(resume=True, allow_new_partitions=True, allow_state_changes=True), {"src": 1})


def test_a_version_1_manifest_reads_and_a_newer_version_is_refused():
    v1 = {"snapshot_id": 4, "flow": "f", "parallelism": 2, "t": [9], "requires": [2],
          "parts": {"0/0": {"states": {}, "sources": {"0": [5, 5]}}, "0/1": {"states": {}, "sources": {"1": [6, 6]}},
                    "1/0": {"states": {"n": {"participant": "f-k-0-n", "base": 2, "deltas": [3]}}, "sources": {}}}}
    m = Manifest.from_json(v1)
    assert (m.version, m.legacy, m.max_parallelism, m.stateful_steps, m.stages) == (1, True, None, None, None)
    assert Manifest.from_json(m.to_json()) == m  # written back as it was read
    check_fit(m, _plan(), RESUME, {"src": 2})  # no max_parallelism to compare; its steps by their state
    with pytest.raises(SnapshotMismatch, match="state of step 'n'"):
        check_fit(m, _plan(steps=("total",)), RESUME, {"src": 2})
    with pytest.raises(UnknownManifestVersion, match="manifest version 9; this build reads versions 1 and 2"):
        Manifest.from_json({**v1, "version": 9})


def test_run_options_for_resume_are_checked():
    from driftstream.engine.model.errors import FlowError

    with pytest.raises(FlowError, match="resume=True and fresh=True contradict"):
        RunConfig(resume=True, fresh=True)
    with pytest.raises(FlowError, match="allow_state_changes is True or False"):
        RunConfig(allow_state_changes="yes")


def test_added_partitions_start_at_their_first_offset_after_the_snapshots_time():
    from driftstream.engine.model.reassignment import reassign

    m = _manifest(_plan())
    parts = reassign(m, _plan(partitions=5), {"src": 5})
    assert parts["0/0"].sources == {"0": [0, 0], "2": [0, 10], "4": [0, 10]}  # T = (9,): times from 10 on
    assert parts["0/1"].sources == {"1": [1, 1], "3": [0, 10]}
    assert reassign(m, _plan(), {"src": 2}) == dict(m.parts)


def test_a_resumed_flow_keeps_the_key_hash_its_snapshot_stored_state_with(tmp_path):
    """Snapshots written before the key hash was recorded hashed keys with a bare CRC-32
    (key hash 1): their state sits in those groups, so a flow resumed from one keeps it."""
    from driftstream.engine.control.resume import start_point
    from driftstream.engine.model.recovery import RecoveryRules
    from driftstream.ordering.key_groups import KEY_HASH
    from driftstream.snapshots.store import SnapshotStore

    plan = _plan()
    written = _manifest(plan)
    assert written.key_hash == KEY_HASH == 2 and Manifest.from_json(written.to_json()) == written
    old = {k: v for k, v in written.to_json().items() if k != "key_hash"}
    assert Manifest.from_json(old).key_hash == 1
    store = SnapshotStore(str(tmp_path))
    store.write_manifest(3, old)
    start = start_point(plan, RESUME, RecoveryRules(RESUME, str(tmp_path)), store, next_id=4)
    assert start.plan.key_groups.key_hash == 1 and start.plan.key_groups.group_of("k0") == plan.key_groups.__class__(128, 1).group_of("k0")
    fresh = start_point(plan, RunConfig(fresh=True), RecoveryRules(RunConfig(fresh=True), str(tmp_path)), store, next_id=4)
    assert fresh.plan.key_groups.key_hash == KEY_HASH
