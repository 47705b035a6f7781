"""The supervisor's record of the replicas' dissents (control/replica_dissents.py): every dissent
kept once across the acker's resets, the vote's rollback named in its recovery's kind, and the run
failed, saying why, once one instance's replicas disagreed with no majority three times, each over
times the one before covered (a step that is not deterministic would otherwise roll back forever;
by hand on Ray an undeclared random draw with r = 2 failed so after 11 s)."""

from __future__ import annotations

from types import SimpleNamespace

from driftstream.engine.control.replica_dissents import MISMATCHES_IN_A_ROW, ReplicaDissents
from driftstream.engine.model.errors import FlowError
from driftstream.engine.runtime.replica_votes import VoteRollback


def _rollback(kind: str, instance: str, t_range: tuple, earlier: tuple = ()) -> VoteRollback:
    last = {"kind": kind, "instance": instance, "replicas": [1, 2], "t_range": t_range, "digests": {1: "a", 2: "b"}}
    return VoteRollback([*earlier, last])


def test_mismatches_each_over_the_times_before_fail_the_run_later_faults_do_not():
    records = ReplicaDissents(SimpleNamespace(acker=None))
    outcomes = [records.rolled_back(_rollback("mismatch", instance, ((lo,), (hi,)))) for instance, lo, hi in [
        ("1/0", 0, 5), ("1/1", 0, 5),  # another instance's: its own count
        ("1/0", 3, 8),                 # the replay of (0, 5) disagreed again
        ("1/0", 20, 30),               # past what it disagreed on: a new fault, counted from one
        ("1/0", 25, 31), ("1/0", 28, 35)]]
    assert [o is None for o in outcomes] == [True] * 5 + [False] and MISMATCHES_IN_A_ROW == 3
    assert isinstance(outcomes[-1], FlowError) and "1/0" in str(outcomes[-1]) and "deterministic" in str(outcomes[-1])


def test_every_dissent_is_kept_once_and_the_rollback_names_its_recovery():
    records = ReplicaDissents(SimpleNamespace(acker=None))
    first = _rollback("corruption", "1/0", ((0,), (5,)))
    records.rolled_back(first)
    assert records.take_kind() == "global (vote: corruption of 1/0's replicas [1, 2] in t ((0,), (5,)))" and records.take_kind() is None
    records.rolled_back(_rollback("corruption", "1/1", ((5,), (9,)), earlier=tuple(first.dissents)))  # the acker's list holds the first again
    assert [d["instance"] for d in records.gather()] == ["1/0", "1/1"]


def test_a_sampled_vote_s_rollback_sets_the_uncertified_snapshots_aside_and_the_store_keeps_the_certified(tmp_path):
    """verify="sample:N": only the snapshots at a sampled epoch's end are certified (here every
    third); the store keeps the newest through its pruning, and a vote's rollback quarantines the
    committed ones after it, so the launch restores it."""
    from driftstream.ordering.epoch_votes import sampled
    from driftstream.snapshots.store import SnapshotStore

    store = SnapshotStore(str(tmp_path / "store"), pinned=lambda sid: sampled(sid, 3))
    for sid in range(1, 9):
        store.write_manifest(sid, {"time": [sid]})
    assert store.committed_ids() == [6, 7, 8]  # keep=2 and the pinned newest certified (6); 3 pruned
    records = ReplicaDissents(SimpleNamespace(acker=None), store)
    assert records.rolled_back(_rollback("corruption", "1/0", ((7,), (8,)))) is None
    assert store.committed_ids() == [6] and store.read_latest_manifest()["snapshot_id"] == 6
    majority = ReplicaDissents(SimpleNamespace(acker=None), SnapshotStore(str(tmp_path / "other")))
    assert majority.set_aside_uncertified("why") == []  # every committed snapshot was certified
