"""CachedEntries: entry state over a StateCache and RocksDB gives what it gives over a dict,
whatever the cache drops (a budget of a few records), writes (bases) or finds in RocksDB
when it opens it (a restored instance): a new entry is known to be new without a RocksDB
read only while RocksDB holds nothing the cache has not seen."""

from __future__ import annotations

import copy

from hypothesis import given, settings, strategies as st

from driftstream.ordering.entry_state import SIZE, EntryKeyedState
from driftstream.ordering.meta import TOP
from driftstream.snapshots.backend import RocksDBBackend
from driftstream.snapshots.entry_cache import CachedEntries
from driftstream.snapshots.state_cache import StateCache

from tests.ordering.test_entry_state import on_dict, on_map
from tests.ordering.test_keyed_state import deliver, scenarios

_maps = st.dictionaries(st.sampled_from("abc"), st.dictionaries(st.sampled_from("pq"), st.text("xyz", min_size=1, max_size=2), min_size=1))


def _reference(final: list, initial: dict) -> tuple:
    maps = copy.deepcopy(initial)
    out = [(meta, on_dict(maps.setdefault(key, {}), payload)) for meta, payload, key in sorted(final, key=lambda e: e[0])]
    return out, maps


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(), advance=st.booleans(), budget=st.sampled_from([600, 1_500, 1 << 20]), bases=st.booleans(), initial=_maps)
def test_entries_over_the_cache_net_out_to_the_in_order_result(tmp_path_factory, scenario, advance, budget, bases, initial):
    path = tmp_path_factory.mktemp("db") / "db"
    db = RocksDBBackend(path)
    for key, entries in initial.items():  # what a restored instance finds in RocksDB
        for entry, value in entries.items():
            db.put((key, entry), value)
        db.put((key, SIZE), len(entries))
    cache = StateCache(db, budget_bytes=budget)
    assert cache.complete == (not initial)
    ks = EntryKeyedState(on_map, backend=CachedEntries(cache))
    final, batches = scenario

    def base() -> None:  # a base after each batch: written states become clean, and may be evicted
        if bases:
            taken = cache.take_unwritten()
            cache.write(taken)
            cache.mark_written(taken)

    net = deliver(ks, batches, advance, after_batch=base)
    expected_out, expected_maps = _reference(final, initial)
    assert net.net() == sorted(expected_out, key=lambda e: e[0])
    ks.advance(TOP)
    for key in "abc":
        assert dict(ks.backend.entries(key)) == expected_maps.get(key, {})
        assert (cache.get((key, SIZE)) or 0) == len(expected_maps.get(key, {}))
    cache.close()

