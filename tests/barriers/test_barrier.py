"""Barrier and Bundle: release only below the watermark, in Meta order; tombstones in any
order relative to their invalidee; duplicate metas; ``skip_through`` for replays; and the
property that any arrival order releases the same sequence."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from driftstream.barriers import barrier as barrier_module
from driftstream.barriers.barrier import Barrier
from driftstream.barriers.bundle import Bundle
from driftstream.ordering.meta import BOTTOM, TOP, Meta


def M(ts, *child, tombstone=False):
    return Meta(ts, 0, 0, ts, tuple(child), tombstone)


def released(bundle):
    return [(tuple(m), p) for m, p in bundle.elements]


# -- Bundle ----------------------------------------------------------------------------


def test_bundle_t_last_is_the_meta_of_the_last_element():
    b = Bundle([(M(1), "x"), (M(2, 0), "y")])
    assert b.t_last == M(2, 0)
    assert b.payloads() == ["x", "y"]
    assert len(b) == 2 and bool(b)


def test_empty_bundle():
    b = Bundle([])
    assert b.t_last is None and not b and len(b) == 0 and b.payloads() == []


def test_bundle_explicit_t_last_is_kept():
    assert Bundle([(M(1), "x")], t_last=M(5)).t_last == M(5)


def test_bundle_after_keeps_what_is_strictly_after_t_last():
    b = Bundle([(M(1), "a"), (M(2), "b"), (M(2, 0), "c"), (M(3), "d")])
    assert b.after(None) is b
    assert b.after(M(2)).payloads() == ["c", "d"]
    assert b.after(M(0)).payloads() == ["a", "b", "c", "d"]
    assert b.after(M(3)).payloads() == [] and b.after(M(3)).t_last is None
    assert b.after(M(2, 0)).t_last == M(3)


# -- Barrier: release --------------------------------------------------------------------


def test_releases_only_below_the_watermark_in_meta_order():
    b = Barrier()
    for m, p in [(M(3), "c"), (M(1, 1), "b2"), (M(5), "e"), (M(1), "b"), (M(1, 0), "b1"), (M(0), "a")]:
        b.add(m, p)
    assert len(b) == 6
    assert not b.release(BOTTOM)
    bundle = b.release((3, 0, 0, 3))  # exclusive: time 3 is not settled
    assert bundle.payloads() == ["a", "b", "b1", "b2"]
    assert bundle.t_last == M(1, 1)
    assert len(b) == 2
    assert not b.release((3, 0, 0, 3))  # nothing new below the same watermark
    assert b.release((4,)).payloads() == ["c"]
    b.add(M(4), "d")  # arrives after a release, above the last watermark
    assert b.release(TOP).payloads() == ["d", "e"]
    assert len(b) == 0
    assert b.released == 7


def test_watermark_equal_to_a_time_does_not_release_it():
    b = Barrier()
    b.add(M(2, 1, tombstone=False), "b")
    b.add(M(2), "a")
    assert not b.release((2, 0, 0, 2))
    assert not b.release((2,))
    assert b.release((2, 0, 0, 3)).payloads() == ["a", "b"]


def test_tombstone_after_its_invalidee_deletes_it():
    b = Barrier()
    b.add(M(1), "a")
    b.add(M(2), "old")
    b.add(M(2, tombstone=True), "old")
    b.add(M(2), "new")
    assert b.release(TOP).payloads() == ["a", "new"]
    assert b.tombstones_released == 0


def test_tombstone_before_its_invalidee_annihilates_with_it():
    b = Barrier()
    b.add(M(2, tombstone=True), "old")
    b.add(M(2), "new")
    b.add(M(1), "a")
    b.add(M(2), "old")
    assert b.release(TOP).payloads() == ["a", "new"]
    assert b.tombstones_released == 0 and b.released == 2


def test_tombstone_matches_the_payload_not_only_the_meta():
    b = Barrier()
    b.add(M(1), "keep")
    b.add(M(1, tombstone=True), "other")
    assert b.release((1, 0, 0, 2)).payloads() == ["keep"]
    # The unmatched tombstone is settled: counted, never released as an element.
    assert b.tombstones_released == 1


def test_tombstone_does_not_delete_a_child_or_a_parent():
    b = Barrier()
    b.add(M(1), "x")
    b.add(M(1, 0), "x")
    b.add(M(1, 0, tombstone=True), "x")
    assert released(b.release(TOP)) == [(M(1), "x")]


def test_duplicate_metas_with_different_payloads_are_all_released():
    b = Barrier()
    b.add(M(1), "p")
    b.add(M(1), "q")
    b.add(M(1), "p")  # an equal duplicate too
    b.add(M(0), "first")
    bundle = b.release(TOP)
    assert bundle.payloads()[0] == "first"
    assert Counter(bundle.payloads()[1:]) == Counter({"p": 2, "q": 1})
    assert [m for m, _ in bundle.elements] == [M(0), M(1), M(1), M(1)]


def test_tombstone_deletes_one_of_duplicate_metas_by_payload():
    b = Barrier()
    b.add(M(1), "p")
    b.add(M(1), "q")
    b.add(M(1), "q")
    b.add(M(1, tombstone=True), "q")
    assert sorted(b.release(TOP).payloads()) == ["p", "q"]


def test_metas_may_be_plain_tuples():
    b = Barrier()
    b.add((2, 0, 0, 2, (), False), "b")
    b.add(tuple(M(1)), "a")
    b.add((2, 0, 0, 2, (), True), "b")
    assert b.release(TOP).payloads() == ["a"]


# -- Barrier: skip_through (exactly-once after recovery) ---------------------------------


def test_skip_through_drops_replayed_elements_at_or_before_t_last():
    b = Barrier()
    b.skip_through(M(2, 0))
    for m, p in [(M(1), "a"), (M(2), "b"), (M(2, 0), "b0"), (M(2, 1), "b1"), (M(3), "c")]:
        b.add(m, p)
    bundle = b.release((3,))
    assert bundle.payloads() == ["b1"]
    assert b.dropped_replayed == 3
    assert b.release(TOP).payloads() == ["c"]
    assert b.released == 2


def test_skip_through_applies_to_later_releases_too():
    b = Barrier()
    b.skip_through(M(5))
    b.add(M(2), "replayed")
    assert not b.release((3,))
    b.add(M(4), "replayed too")
    b.add(M(6), "new")
    assert b.release(TOP).payloads() == ["new"]
    assert b.dropped_replayed == 2


def test_skip_through_none_keeps_everything():
    b = Barrier()
    b.skip_through(None)
    b.add(M(1), "a")
    assert b.release(TOP).payloads() == ["a"]
    assert b.dropped_replayed == 0


def test_recovered_output_equals_output_without_failure():
    """A sink held bundles up to t_last; after a replay the barrier completes it exactly."""
    elements = [(M(t, *c), f"{t}{c}") for t in range(6) for c in [(), (0,), (1,)]]
    full = Barrier()
    for m, p in elements:
        full.add(m, p)
    expected = full.release(TOP).elements

    first = Barrier()
    for m, p in elements[:10]:
        first.add(m, p)
    written = first.release((3,)).elements  # the sink got this, then the run failed
    t_last = written[-1][0]

    replay = Barrier()
    replay.skip_through(t_last)
    for m, p in reversed(elements):  # the replay re-emits everything from the snapshot, in any order
        replay.add(m, p)
    rest = []
    for w in [(2,), (4,), TOP]:
        rest += replay.release(w).elements
    assert written + rest == expected


# -- the determinism property ----------------------------------------------------------

meta_keys = st.tuples(st.integers(0, 6), st.integers(0, 2), st.lists(st.integers(0, 1), max_size=2).map(tuple))


@st.composite
def scenarios(draw):
    """Final elements, plus corrections (an old version and its tombstone, with or
    without a replacement) and permanent duplicates, all in a random arrival order."""
    final, deliveries = [], []
    for ts, part, child in draw(st.lists(meta_keys, min_size=1, max_size=12, unique=True)):
        meta = Meta(ts, 0, part, ts, child)
        kind = draw(st.sampled_from(["plain", "corrected", "retracted", "duplicated"]))
        if kind in ("corrected", "retracted"):
            old = draw(st.text("xyzw", min_size=1, max_size=2))
            deliveries += [(meta, old), (meta.as_tombstone(), old)]
        if kind != "retracted":
            copies = draw(st.integers(2, 3)) if kind == "duplicated" else 1
            for _ in range(copies):
                payload = draw(st.text("xyz", min_size=1, max_size=2))
                final.append((meta, payload))
                deliveries.append((meta, payload))
    order = draw(st.permutations(deliveries))
    release_after = draw(st.sets(st.integers(0, len(order))))
    return final, order, release_after


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_any_arrival_order_releases_the_same_sequence(scenario):
    final, order, release_after = scenario
    b = Barrier()
    out = []
    previous_w = BOTTOM
    for i, (meta, payload) in enumerate(order):
        b.add(meta, payload)
        if i + 1 in release_after and i + 1 < len(order):
            # A legal watermark: every element and tombstone below it has arrived.
            w = min(m.time for m, _ in order[i + 1 :])
            bundle = b.release(w)
            assert all(previous_w <= m < w for m, _ in bundle.elements)
            assert [m for m, _ in bundle.elements] == sorted(m for m, _ in bundle.elements)
            if bundle:
                assert bundle.t_last == bundle.elements[-1][0]
            previous_w = max(previous_w, w)
            out += bundle.elements
    out += b.release(TOP).elements
    assert len(b) == 0
    assert b.tombstones_released == 0  # every tombstone met its element
    # Released in Meta order, the same metas, the same payloads per meta.
    assert [m for m, _ in out] == sorted(m for m, _ in final)
    assert Counter((tuple(m), p) for m, p in out) == Counter((tuple(m), p) for m, p in final)
    # Where metas are unique (everything but permanent duplicates), the exact sequence.
    counts = Counter(m for m, _ in final)
    unique = [(tuple(m), p) for m, p in final if counts[m] == 1]
    assert [(tuple(m), p) for m, p in out if counts[m] == 1] == sorted(unique)
    assert b.released == len(final)


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.integers(0, 60), max_size=120), cuts=st.lists(st.integers(0, 70), max_size=12))
def test_releases_at_any_watermarks_give_every_element_once_in_order(times, cuts):
    """Elements added between releases at rising watermarks (each release keeps a sorted run):
    the concatenated bundles are every element once, in Meta order, ties in the order added."""
    barrier, released, added = Barrier(), [], []
    chunks = [times[i::max(1, len(cuts))] for i in range(max(1, len(cuts)))]
    watermark = 0
    for chunk, cut in zip(chunks, sorted(cuts) or [0]):
        for n, t in enumerate(chunk):
            if t >= watermark:  # below it everything has arrived: a barrier never gets such an element
                barrier.add(Meta(t, 0, 0, t), (t, len(released), n))
                added.append((t, len(released), n))
        watermark = max(watermark, cut)
        released += barrier.release((watermark,)).elements
        assert all(m[0] < watermark for m, _ in released)
    released += barrier.release((10**9,)).elements
    # in t order; among equal t, in the order they were added (a stable sort of what was added)
    assert [p for _, p in released] == sorted(added, key=lambda p: p[0]) and len(barrier) == 0


# -- add_many and release against the plain algorithm ----------------------------------


class PlainBarrier:
    """The barrier's rules the plainest way (everything held re-sorted each release, each
    released element looked up among the tombstones): the reference for Barrier's runs,
    its tombstones found by bisection and its replayed prefix cut by bisection."""

    def __init__(self, drop_through=None):
        self.held, self.tombstones, self.drop_through = [], {}, drop_through
        self.tombstones_released = self.dropped_replayed = 0

    def add(self, meta, payload):
        if meta[5]:
            self.tombstones.setdefault(meta._replace(tombstone=False), []).append(payload)
        else:
            self.held.append((meta, payload))

    def release(self, w):
        ready = sorted((e for e in self.held if e[0] < w), key=lambda e: e[0])
        self.held = [e for e in self.held if not e[0] < w]
        kept = []
        for meta, payload in ready:
            cancel = self.tombstones.get(meta)
            if cancel and payload in cancel:
                cancel.remove(payload)
            else:
                kept.append((meta, payload))
        for meta in [m for m in self.tombstones if m < w]:
            self.tombstones_released += len(self.tombstones.pop(meta))
        if self.drop_through is not None:
            self.dropped_replayed += sum(1 for m, _ in kept if not m > self.drop_through)
            kept = [e for e in kept if e[0] > self.drop_through]
        return kept


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.lists(st.tuples(meta_keys, st.text("xyz", min_size=1, max_size=2)), max_size=3),
       st.one_of(st.none(), meta_keys), st.booleans())
def test_add_many_and_releases_give_the_plain_algorithms_bundles(scenario, lone, through, batched):
    """Corrections, duplicates, tombstones whose element never comes (counted, kept visible)
    and a replayed prefix to drop: ``add_many`` of a step's triples and each release give the
    bundles and counts of the plain algorithm."""
    _, order, release_after = scenario
    order = list(order) + [(Meta(ts, 0, part, ts, child, True), p) for (ts, part, child), p in lone]
    drop = None if through is None else Meta(through[0], 0, through[1], through[0], through[2])
    for native in (barrier_module.NATIVE, None):  # the C sort and bisection, and the Python's
        saved, barrier_module.NATIVE = barrier_module.NATIVE, native
        try:
            b, plain = Barrier(), PlainBarrier(drop)
            if drop is not None:
                b.skip_through(drop)
            pending, w = [], BOTTOM
            for i, (meta, payload) in enumerate(order):
                pending.append((meta, payload, None))
                plain.add(meta, payload)
                if i + 1 in release_after or i + 1 == len(order):
                    if batched:
                        b.add_many(pending)
                    else:
                        for m, p, _ in pending:
                            b.add(m, p)
                    pending = []
                    # A legal watermark: every element and tombstone below it has arrived.
                    w = max(w, min((m.time for m, _ in order[i + 1:]), default=TOP))
                    assert released(b.release(w)) == [(tuple(m), p) for m, p in plain.release(w)]
            assert (b.tombstones_released, b.dropped_replayed) == (plain.tombstones_released, plain.dropped_replayed)
        finally:
            barrier_module.NATIVE = saved
