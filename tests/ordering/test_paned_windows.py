"""Panes: a sliding count folded per pane gives what folding every window gives, in any
arrival order, with late elements, tombstones and a restore from any snapshot watermark."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.engine.api.aggregates import window_counts, window_fold, window_value
from driftstream.ordering.ack_table import AckTable
from driftstream.ordering.keyed_state import DictBackend
from driftstream.ordering.meta import TOP, tombstone_of
from driftstream.ordering.paned_windows import PanedWindowState, paned
from driftstream.ordering.windowed_state import WindowedState
from driftstream.ordering.windows import Sliding, WindowSpec
from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.memory_size import RECORD_OVERHEAD
from driftstream.snapshots.state_cache import StateCache


def _plus_one(n, _x):
    return n + 1


def spec(size_ms: int, slide_ms: int, lateness: float) -> WindowSpec:
    return WindowSpec(Sliding(size_ms / 1000, slide_ms / 1000), window_fold(0, _plus_one), window_value,
                      timestamp=lambda x: x[0] / 1000, allowed_lateness=lateness, combine=window_counts)


def run(state, arrivals: list, watermarks: list) -> list:
    """Feed ``arrivals`` in batches, moving the watermark after each as ``watermarks`` says;
    returns everything emitted, (meta, payload) sorted."""
    acks, out = AckTable(), []
    for batch, wm in zip(arrivals, watermarks):
        out += state.apply_batch(batch, acks)
        if wm is not None:
            state.advance(wm)
            out += state.fire(wm, acks)
    state.advance(TOP)
    out += state.fire(TOP, acks)
    return sorted(out, key=repr)


elements = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.sampled_from("ab")), min_size=1, max_size=40)


def schedule(items: list, seed: int, retract: bool) -> tuple:
    """Metas for ``items`` ``(ts, lag, key)`` (event time ``ts - lag``, in 100 ms units), shuffled
    into batches, some retracted; each batch followed by a watermark below everything still to come."""
    rng = random.Random(seed)
    feed = [((ts * 100, 0, 0, i, (), False), ((ts - lag) * 100, i), key) for i, (ts, lag, key) in enumerate(items)]
    if retract:
        feed += [(tombstone_of(m), p, k) for m, p, k in feed if rng.random() < 0.3]
    rng.shuffle(feed)
    batches = [feed[i:i + 3] for i in range(0, len(feed), 3)]
    watermarks = []
    for n in range(len(batches)):
        rest = [m for b in batches[n + 1:] for m, _, _ in b]
        # a tombstone's element must arrive before the watermark passes it too
        rest += [(m[0], m[1], m[2], m[3], m[4], False) for b in batches[n + 1:] for m, _, _ in b]
        watermarks.append(min(rest) if rest and rng.random() < 0.5 else None)
    return batches, watermarks


@settings(max_examples=150, deadline=None)
@given(elements, st.integers(0, 10**6), st.sampled_from([(1000, 200), (1000, 300), (600, 400), (500, 100)]),
       st.sampled_from([0.0, 0.15]), st.booleans(), st.booleans())
def test_panes_give_the_windows_every_window_gives(tmp_path_factory, items, seed, shape, lateness, retract, cached):
    """``cached``: the panes live in a StateCache of a few records over RocksDB, so firing reads
    some from its dict and the spilled ones through ``get``."""
    s = spec(*shape, lateness)
    assert paned(s)
    batches, watermarks = schedule(items, seed, retract)
    backend = None
    if cached:
        backend = StateCache(RocksDBBackend(tmp_path_factory.mktemp("panes") / "db"), budget_bytes=3 * RECORD_OVERHEAD,
                             track_changes=False)
    try:
        panes = run(PanedWindowState(s, backend=backend, seed=1), batches, watermarks)
        assert panes == run(WindowedState(s, seed=1), batches, watermarks)
    finally:
        if backend is not None:
            backend.close()


@settings(max_examples=150, deadline=None)
@given(elements, st.integers(0, 10**6), st.sampled_from([(1000, 200), (600, 400)]), st.sampled_from([0.0, 0.15]),
       st.integers(0, 45), st.sampled_from([PanedWindowState, WindowedState]))
def test_a_restore_at_a_snapshot_watermark_emits_what_the_run_emits_from_it(items, seed, shape, lateness, cut, form):
    """State after the watermark reached T (results at T emitted), restored with its timers,
    then fed what is at or after T: it emits exactly the uninterrupted run's output at or after
    T, and keeps no state of a window emitted before T."""
    s = spec(*shape, lateness)
    rng = random.Random(seed)
    feed = [((ts * 100, 0, 0, i, (), False), ((ts - lag) * 100, i), key) for i, (ts, lag, key) in enumerate(items)]
    rng.shuffle(feed)
    T = (cut * 100, -1, -1, -1)
    whole = run(form(s, seed=1), [feed], [None])
    first = form(s, seed=1)
    acks = AckTable()
    first.apply_batch([x for x in feed if x[0] < T], acks)
    first.advance(T)
    first.fire(T, acks)
    backend = DictBackend()
    for k, v in first.keyed.backend.items():
        backend.put(k, v)
    restored = form(s, backend=backend, seed=1)
    restored.restore_timers(AckTable(), T)
    after = run(restored, [[x for x in feed if x[0] >= T]], [None])
    assert after == [x for x in whole if x[0] >= T]
    restored.advance(TOP)  # forgets what the last fire emitted
    assert not list(restored.keyed.backend.items())  # every window emitted, every state gone
