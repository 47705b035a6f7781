"""The acker's tally of the replicas' votes on Ray (ordering/epoch_votes.py): whatever order the
digests arrive in, an epoch passes only once every live replica of the instance agreed (or a
majority outvoted secondaries, which then vote no more), a dissenting primary or no majority halts
the tally, and the gate never opens past an epoch some instance has not passed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.ordering.epoch_votes import EpochVotes, sampled
from driftstream.ordering.meta import BOTTOM


@st.composite
def runs(draw) -> tuple:
    """Instances with 2-3 replicas, epochs, each replica's digest per epoch ("ok", or a corrupt
    one's own from some epoch on), and the arrival order of the digests (per replica in order)."""
    instances = {f"i{n}": list(range(10 * n, 10 * n + draw(st.integers(2, 3)))) for n in range(draw(st.integers(1, 3)))}
    epochs = draw(st.integers(1, 5))
    corrupt = {inc: draw(st.integers(0, epochs)) for incs in instances.values() for inc in incs
               if draw(st.booleans()) and draw(st.booleans())}  # replica -> the first epoch it digests wrong
    queues = {(key, inc): [(k, f"bad{inc}" if inc in corrupt and k >= corrupt[inc] else "ok") for k in range(epochs)]
              for key, incs in instances.items() for inc in incs}
    order = []
    while any(queues.values()):
        who = draw(st.sampled_from(sorted(q for q in queues if queues[q])))
        order.append((who, queues[who].pop(0)))
    return instances, epochs, corrupt, order


def _replay(instances: dict, epochs: int, order: list) -> tuple:
    votes = EpochVotes(instances)
    for k in range(epochs):
        votes.ended(100 + k, (10 * (k + 1),))
    verdicts, gates = [], []
    for (key, inc), (k, digest) in order:
        verdicts += votes.add(key, inc, 100 + k, digest)
        gates.append(votes.released_through())
    return votes, verdicts, gates


@settings(max_examples=200, deadline=None)
@given(runs())
def test_the_gate_opens_only_past_agreed_epochs_whatever_the_order(run):
    instances, epochs, corrupt, order = run
    votes, verdicts, gates = _replay(instances, epochs, order)
    assert gates == sorted(gates)  # never closes again
    first_bad = {}  # instance -> the first epoch some replica of it digested wrong
    for key, incs in instances.items():
        bad = [corrupt[inc] for inc in incs if inc in corrupt and corrupt[inc] < epochs]
        if bad:
            first_bad[key] = min(bad)
    for v in verdicts:  # none without a wrong digest; a majority names exactly the wrong ones
        wrong = sorted(inc for inc, d in v.digests.items() if d != "ok")
        assert wrong and v.epoch - 100 >= first_bad[v.instance]
        assert v.kind == "mismatch" or v.dissenters == wrong or v.dissenters == sorted(set(v.digests) - set(wrong))
        assert v.rolls_back == (v.kind == "mismatch" or instances[v.instance][0] in v.dissenters)
    rolled = [v for v in verdicts if v.rolls_back]
    assert len(rolled) <= 1 and votes.halted == bool(rolled)
    if rolled:  # the gate stops before the epoch of the rollback
        assert gates[-1] < (10 * (rolled[0].epoch - 100 + 1),)
    else:  # every epoch passed, outvoted secondaries or not
        assert gates[-1] == (10 * epochs,) and (verdicts or not first_bad)
    # the same outcome in another order of arrival (a rollback halts every instance: what the
    # others voted before it depends on the order, that it comes does not)
    again = _replay(instances, epochs, sorted(order, key=lambda o: (o[1][0], o[0])))[1]
    if rolled:
        assert [v.rolls_back for v in again].count(True) == 1
    else:
        assert sorted(map(repr, again)) == sorted(map(repr, verdicts))


def test_a_corrupt_secondary_is_named_and_votes_no_more():
    votes = EpochVotes({"a": [1, 2, 3]})
    votes.ended(7, (10,))
    votes.ended(8, (20,))
    assert votes.add("a", 1, 7, "x") == [] and votes.add("a", 3, 7, "y") == []
    (verdict,) = votes.add("a", 2, 7, "x")
    assert (verdict.dissenters, verdict.kind, verdict.rolls_back, verdict.t_range) == ([3], "corruption", False, (BOTTOM, (10,)))
    assert votes.voters["a"] == [1, 2] and votes.released_through() == (10,) and votes.certified(7)
    assert votes.add("a", 1, 8, "z") == [] and votes.add("a", 2, 8, "z") == [] and votes.released_through() == (20,)


def test_a_vote_that_waits_for_a_dead_replica_goes_on_without_it():
    votes = EpochVotes({"a": [1, 2]})
    votes.ended(7, (10,))
    votes.add("a", 1, 7, "x")
    assert votes.released_through() == BOTTOM
    assert votes.lost("a", 2) == [] and votes.released_through() == (10,)


def test_two_replicas_that_differ_roll_back_and_nothing_passes_after():
    votes = EpochVotes({"a": [1, 2], "b": [3, 4]})
    votes.ended(7, (10,))
    votes.ended(None, (float("inf"),))
    votes.add("a", 1, 7, "x")
    (verdict,) = votes.add("a", 2, 7, "y")
    assert verdict.kind == "mismatch" and verdict.rolls_back and verdict.dissenters == [1, 2]
    for inc in (3, 4):
        votes.add("b", inc, 7, "z")
        votes.add("b", inc, None, "z")
    assert votes.halted and votes.released_through() == BOTTOM and not votes.certified(7)


@settings(max_examples=150, deadline=None)
@given(runs(), st.integers(1, 4))
def test_sample_votes_only_the_sampled_epochs_and_passes_the_others(run, every):
    instances, epochs, corrupt, order = run
    votes = EpochVotes(instances, every=every)
    verdicts = []
    for k in range(epochs):
        verdicts += votes.ended(100 + k, (10 * (k + 1),))
    for (key, inc), (k, digest) in order:
        if sampled(100 + k, every):  # the replicas digest the sampled epochs only
            verdicts += votes.add(key, inc, 100 + k, digest)
    assert all(sampled(v.epoch, every) for v in verdicts)
    wrong_sampled = {key for key, incs in instances.items() for inc in incs
                     if inc in corrupt and any(sampled(100 + k, every) for k in range(corrupt[inc], epochs))}
    named = {v.instance for v in verdicts}
    if any(v.rolls_back for v in verdicts):  # a rollback halts the tally: the others may not be voted
        assert named <= wrong_sampled
    else:  # every corruption in a sampled epoch is named, no other; the gate passes every epoch
        assert named == wrong_sampled and votes.released_through() == (10 * epochs,)
    assert all(not votes.certified(100 + k) for k in range(epochs) if not sampled(100 + k, every))
