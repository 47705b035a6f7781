"""The replicas' digests per epoch and the vote over them (ordering/replica_digests.py): equal
for replicas that settled the same, whatever the order their state lists in; different for a
flipped value or a released element; a strict majority names the dissenters."""

from __future__ import annotations

from hypothesis import given, strategies as st

from driftstream.ordering.replica_digests import Epochs, ReplicaDigest, flipped, state_digest, vote

ELEMENTS = [((1, 0, 0, 1), "a"), ((4, 0, 0, 4), "b"), ((6, 0, 1, 6), "c"), ((9, 0, 0, 9), "d")]


def _epochs(*ts: int) -> Epochs:
    epochs = Epochs()
    for t in ts:
        epochs.add((t,))
    return epochs


def _digest(epochs: Epochs, bundles: list, state: list, k: int = 0) -> ReplicaDigest:
    d = ReplicaDigest(epochs)
    for bundle in bundles:
        d.released("out", bundle)
    d.ended(k, state_digest(state))
    return d


def test_an_epoch_holds_the_times_from_its_snapshot_to_the_next():
    epochs = _epochs(5, 8)
    assert [epochs.of(m) for m, _ in ELEMENTS] == [0, 0, 1, 2]
    assert epochs.range(0) == (None, (5,)) and epochs.range(2) == ((8,), None) and epochs.range(3) == (None, None)
    epochs.add((8,))  # a marker at a watermark already a boundary: no empty epoch
    epochs.cut(1)
    assert epochs.boundaries == [(5,)]


@given(st.integers(min_value=1, max_value=3))
def test_how_the_releases_are_cut_in_bundles_does_not_change_the_digest(n):
    epochs = _epochs(5)
    whole = _digest(epochs, [ELEMENTS[:2]], [("k", 1)])
    cut = _digest(epochs, [ELEMENTS[:2][:n], ELEMENTS[:2][n:]], [("k", 1)])
    assert whole.digest(0) == cut.digest(0) is not None


def test_a_flipped_state_value_or_a_different_release_changes_the_epochs_digest():
    epochs = _epochs(5)
    good = _digest(epochs, [ELEMENTS[:2]], [("k", "xy"), ("j", 2)])
    assert good.digest(0) == _digest(epochs, [ELEMENTS[:2]], [("j", 2), ("k", "xy")]).digest(0)
    assert good.digest(0) != _digest(epochs, [ELEMENTS[:2]], [("k", flipped("xy")), ("j", 2)]).digest(0)
    assert good.digest(0) != _digest(epochs, [ELEMENTS[:1]], [("k", "xy"), ("j", 2)]).digest(0)
    # What it released in a later epoch is not in this one's digest.
    assert good.digest(0) == _digest(epochs, [ELEMENTS], [("k", "xy"), ("j", 2)]).digest(0)


def test_a_replica_votes_only_on_the_epochs_it_saw_whole():
    epochs = _epochs(5, 8)
    late = ReplicaDigest(epochs, first=1, since=(6,))  # a replacement: its sinks released from 6 on
    late.ended(1, state_digest([]))
    late.ended(2, state_digest([]))
    assert not late.covers(0) and not late.covers(1) and late.covers(2)
    assert late.digest(1) is None and late.digest(2) is not None
    late.forget(2)
    assert late.digest(2) is None


def test_a_strict_majority_names_the_dissenters_and_a_tie_has_none():
    assert vote({1: "a", 2: "b", 3: "a"}).dissenters == [2]
    assert vote({1: "a", 2: "a", 3: "a"}).dissenters == []
    tie = vote({1: "a", 2: "b"})
    assert tie.agreed is None and tie.dissenters == [1, 2]
    assert vote({1: "a", 2: "b", 3: "c"}).agreed is None


def test_a_flip_changes_a_value_of_each_kind_it_knows_and_twice_gives_it_back():
    for value in (0, 7, "a", "xyz", ("a", "b"), (1,)):
        assert flipped(value) != value and flipped(flipped(value)) == value
    assert flipped(None) is None and flipped(True) is None and flipped(()) is None and flipped([1]) is None
