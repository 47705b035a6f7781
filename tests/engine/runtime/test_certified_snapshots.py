"""Which snapshots a simulated run's votes certified (runtime/certified_snapshots.py): what a
rollback or a replacement replica may restore, across restarts and rescales."""

from __future__ import annotations

from driftstream.engine.runtime.certified_snapshots import CertifiedSnapshots

EVERY = lambda k: True  # noqa: E731  (majority: every epoch voted)


def test_a_snapshot_is_certified_once_every_instance_passed_the_epoch_before_it():
    c = CertifiedSnapshots()
    c.commit(1, 4)
    c.commit(2, 6)
    assert c.target(frontier=1, sampled=EVERY) == (1, 4) and not c.holds(6, 1, EVERY)
    assert c.target(frontier=2, sampled=EVERY) == (2, 6)
    assert c.target(2, lambda k: k % 2 == 0) == (1, 4)  # sample:2: epoch 1 unvoted, snapshot 2 not certified
    assert c.target(2, EVERY, kept={4}) == (1, 4)  # the store pruned 6


def test_after_a_rescale_only_its_snapshot_is_certified_and_no_marker_taints_it():
    c = CertifiedSnapshots()
    c.commit(1, 4)
    c.rescaled(2, 9)  # the rescale's snapshot began epoch 2, reassigned as snapshot 9
    assert c.target(5, EVERY) == (2, 9) and not c.holds(4, 5, EVERY)  # never one from before it
    c.commit(2, 11)  # a snapshot begun again at its boundary: the first stays
    c.taint(2)  # ... and what its marker finds is not in the snapshot restarted from
    assert c.target(5, EVERY) == (2, 9)
    c.commit(3, 12)
    c.taint(3)
    assert c.target(5, EVERY) == (2, 9)


def test_a_rollback_forgets_the_snapshots_after_it():
    c = CertifiedSnapshots()
    for k, sid in ((1, 3), (2, 5), (3, 7)):
        c.commit(k, sid)
    c.taint(3)
    c.rolled_back(2)
    assert c.committed == {1: 3, 2: 5} and c.tainted == set() and c.target(3, EVERY) == (2, 5)
