"""ChannelAcker: per channel incarnation tables. Without a failure it is the default acker;
after one, any interleaving of sends, acks, late acks of the dead and holds gives the
watermark a model computes from the surviving channels alone."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from driftstream.ordering.acker import Acker
from driftstream.ordering.channel_tables import ChannelAcker
from driftstream.ordering.meta import BOTTOM, TOP, successor


def T(ts):
    return (ts, 0, 0, ts)


def test_a_dead_receivers_unacked_batch_no_longer_holds_the_watermark():
    a = ChannelAcker(sources=1)
    a.update({((1, 2), T(3)): 7}, source=0, bound=T(5))
    assert a.watermark == T(3)  # held by the batch to incarnation 2
    a.discard(2)
    a.update({})
    assert a.watermark == successor(T(5))
    a.update({((1, 2), T(3)): 7})  # its ack, come late: dropped, no entry reopened
    assert a.in_flight() == 0 and a.watermark == successor(T(5))


def test_a_dead_senders_lost_hold_leaves_no_entry_open():
    """The receiver acked a batch whose sender's XOR died with it: one table per channel, so
    the lone XOR is discarded with the sender's channels."""
    a = ChannelAcker(sources=1)
    a.update({((9, 1), T(2)): 5}, source=0, bound=T(4))  # receiver 1 acks; sender 9's hold never came
    assert a.watermark == T(2)
    assert a.discard(9) == [(9, 1)]
    assert a.update({}) == successor(T(4))


def test_a_dead_incarnations_late_bound_is_dropped_and_the_replacements_taken():
    """A source instance's bound, sent before it failed and still in flight (in an acker
    shard's batch), must not overtake its replacement's re-read from the snapshot."""
    a = ChannelAcker(sources=2)
    a.update({}, source=(0, 7), bound=T(4))
    a.update({}, source=(1, 8), bound=T(9))
    a.discard(7)
    a.reset_bound(0)
    a.update_many({}, {(0, 7): T(20)})  # the old incarnation's, come late
    assert a.frontier_raw() == BOTTOM
    a.update({}, source=(0, 9), bound=T(2))  # the replacement's
    assert a.frontier_raw() == successor(T(2))


def test_the_watermark_never_moves_back_but_the_raw_frontier_does():
    a = ChannelAcker(sources=1)
    a.update({}, source=0, bound=T(8))
    assert a.watermark == successor(T(8))
    a.reset_bound(0)  # the source instance restarts from a snapshot
    a.hold("replay", T(2))
    assert a.update({((3, 4), T(5)): 1}) == successor(T(8))
    assert a.frontier_raw() == BOTTOM
    a.update({}, source=0, bound=T(3))
    assert a.frontier_raw() == T(2)
    a.release("replay")
    assert a.frontier_raw() == successor(T(3))
    a.update({((3, 4), T(5)): 1}, source=0, bound=TOP)
    assert a.frontier_raw() == TOP == a.watermark


def _merged(xors: dict) -> dict:
    out: dict = {}
    for (_, t), x in xors.items():
        out[t] = out.get(t, 0) ^ x
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 6)), max_size=25), st.randoms(use_true_random=False))
def test_without_a_failure_it_is_the_default_acker(batches, rnd):
    """Every batch sent and acked in any order, flushes of several at once: the same watermark as one table."""
    events = [(i, side) for i in range(len(batches)) for side in (0, 1)]
    rnd.shuffle(events)
    ids = [rnd.getrandbits(64) | 1 for _ in batches]
    plain, channels = Acker(sources=1), ChannelAcker(sources=1)
    plain.update({}, source=0, bound=T(10))
    channels.update({}, source=0, bound=T(10))
    while events:
        k = rnd.randint(1, 3)
        flush, events = events[:k], events[k:]
        xors: dict = {}
        for i, _ in flush:
            s, r, t = batches[i]
            key = ((s, r), T(t))
            xors[key] = xors.get(key, 0) ^ ids[i]
        assert channels.update(xors) == plain.update(_merged(xors))
    assert channels.watermark == plain.watermark == successor(T(10))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=25),
       st.integers(0, 3), st.randoms(use_true_random=False))
def test_after_a_failure_the_watermark_is_the_survivors(batches, dead, rnd):
    """Sends and acks in any order; incarnation ``dead`` fails at a random point, some of its
    XORs never come and the rest come late; a hold stands until the replay is in. The raw
    frontier is the least open time of the surviving channels (a model recomputed from
    scratch), the watermark the most it ever was."""
    events = [(i, side) for i in range(len(batches)) for side in (0, 1)]
    rnd.shuffle(events)
    ids = [rnd.getrandbits(64) | 1 for _ in batches]
    fail_at = rnd.randrange(len(events) + 1)
    a = ChannelAcker(sources=1)
    a.update({}, source=0, bound=T(10))
    folded: list = []  # (channel, t, id) the model counts
    highest = a.watermark
    for n, (i, side) in enumerate(events):
        if n == fail_at:
            a.discard(dead)
            a.hold("replay", T(1))
        s, r, t = batches[i]
        if n >= fail_at and dead in (s, r) and rnd.random() < 0.5:
            continue  # lost with the dead incarnation
        a.update({((s, r), T(t)): ids[i]})
        folded.append(((s, r), T(t), ids[i]))
        if n == fail_at + 2:
            a.release("replay")
        open_: dict = {}
        for ch, tt, x in folded:
            if n >= fail_at and dead in ch:
                continue
            open_[(ch, tt)] = open_.get((ch, tt), 0) ^ x
        model = min([tt for (_, tt), x in open_.items() if x] + [successor(T(10))])
        if "replay" in a.holds:
            model = min(model, T(1))
        highest = max(highest, model)
        assert a.frontier_raw() == model
        assert a.watermark == highest


def test_the_least_open_time_per_receiver_is_kept_while_asked_for():
    """keep_receivers builds a heap per receiver from the tables; then each new open time goes
    in, acked and discarded ones drop out lazily; least_by_receiver is each receiver's least."""
    a = ChannelAcker(sources=0)
    a.update({((1, 2), (5, 0, 0, 5)): 3, ((1, 3), (7, 0, 0, 7)): 4})
    a.keep_receivers(True)
    a.update({((3, 2), (4, 0, 0, 4)): 5, ((2, 2), (9, 0, 0, 9)): 6})  # a send into 2, and 2's own timer
    assert a.least_by_receiver() == {2: (4, 0, 0, 4), 3: (7, 0, 0, 7)}
    a.update({((3, 2), (4, 0, 0, 4)): 5})  # acked
    assert a.least_by_receiver() == {2: (5, 0, 0, 5), 3: (7, 0, 0, 7)}
    a.discard(3)  # 3 died: its channels go, into it and out of it
    assert a.least_by_receiver() == {2: (5, 0, 0, 5)}
    a.keep_receivers(False)
    assert a.by_receiver is None


def test_a_replacement_set_aside_holds_no_one_until_it_joins():
    """A replacement replica (incarnation 9) restored at T(2): its replay into it, its timer and
    its hold stay out of the watermark; it is told no further than them; once they are past the
    watermark it joins and counts again."""
    a = ChannelAcker(sources=1)
    a.update({((1, 2), T(6)): 3}, source=0, bound=T(8))
    a.set_aside(9)
    a.hold((9, "s"), T(2))
    a.update({((1, 9), T(3)): 5, ((9, 9), T(4)): 6})  # the replay's batch, its timer
    assert a.watermark == T(6) and a.frontier_raw() == T(6)
    assert a.frontier_of(9) == T(2) and a.frontier_of(2) == T(6)
    a.release((9, "s"))
    assert a.frontier_of(9) == T(3)
    a.update({((1, 9), T(3)): 5, ((9, 9), T(4)): 6})  # acked, fired
    a.update({((1, 9), T(7)): 11})  # a new batch into it, above the watermark
    assert a.frontier_of(9) == T(6)
    a.join(9)
    assert a.update({((1, 2), T(6)): 3}) == T(7)  # its open batch holds the watermark now
    a.discard(9)
    assert a.update({}) == successor(T(8))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=25),
       st.integers(0, 3), st.randoms(use_true_random=False))
def test_an_incarnation_aside_is_out_of_the_watermark_and_in_its_own_frontier(batches, aside, rnd):
    """Sends and acks in any order with incarnation ``aside`` set aside from the start (a new
    incarnation) and joined at a random point: the raw frontier is the least open time of the
    channels not into it (a model), its own frontier the least of all; once joined, it is every
    channel's."""
    events = [(i, side) for i in range(len(batches)) for side in (0, 1)]
    rnd.shuffle(events)
    ids = [rnd.getrandbits(64) | 1 for _ in batches]
    start, end = 0, rnd.randrange(len(events) + 1)
    a = ChannelAcker(sources=1)
    a.update({}, source=0, bound=T(10))
    folded: dict = {}
    for n, (i, _) in enumerate(events):
        if n == start:
            a.set_aside(aside)
        if n == end:
            a.join(aside)
        s, r, t = batches[i]
        a.update({((s, r), T(t)): ids[i]})
        folded[((s, r), T(t))] = folded.get(((s, r), T(t)), 0) ^ ids[i]
        apart = start <= n < end
        open_ = [(ch, tt) for (ch, tt), x in folded.items() if x]
        whole = min([tt for _, tt in open_] + [successor(T(10))])
        others = min([tt for ch, tt in open_ if not (apart and ch[1] == aside)] + [successor(T(10))])
        assert a.frontier_raw() == others
        assert a.frontier_of(aside) == whole
