"""A batch re-run in another process (the verifier): shipped, pickled as Ray does, and re-run
from the shipped logs and settled records, it agrees with a healthy state for any arrival order,
tombstones and folds (value and entry state, an entry state's reads of records a fold moved to
the backend); a wrong result, a state gone bad after the batch and a read the live run never
made are told apart; the digests do not depend on the process's string hashes."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys

from hypothesis import given, settings, strategies as st

from driftstream.ordering.entry_state import DictEntryBackend, EntryKeyedState
from driftstream.ordering.keyed_state import DictBackend, DriftingKeyedState
from driftstream.ordering.meta import Meta
from driftstream.ordering.shipped_reexecution import canonical_digest, rerun, ship
from driftstream.ordering.written_digests import CheckedEntries, CheckedValues

from tests.ordering.arrival_orders import batches


def _concat(state, x):
    new = (state or "") + x
    return new, {new, x}  # a set: its order follows the process's string hashes


def _pages(entries, x):
    entries.put(x, entries.get(x, "") + x)
    return entries.get("a", "-") + entries.get("b", "-") + str(len(entries))  # reads records other elements wrote


def _state(kind: str, fn=None):
    if kind == "values":
        return DriftingKeyedState(fn or _concat, backend=CheckedValues(DictBackend()))
    backend = CheckedEntries(DictEntryBackend())
    backend.track()
    return EntryKeyedState(fn or _pages, backend=backend)


def _fresh(kind: str):
    fn = _concat if kind == "values" else _pages
    state_class = DriftingKeyedState if kind == "values" else EntryKeyedState
    return lambda backend: state_class(fn, backend=backend)


def _shipped(live, batch, also=()):
    """Ship ``batch``, run it live, and the differences its re-run finds after a pickle round
    trip (as a Ray call does)."""
    shipment = ship(live, 0, batch, also)
    out = live.apply_items(batch)
    shipment.add_settled(live, getattr(live.backend, "read", None))
    shipment.add_live(live, out)
    verdict = rerun(pickle.loads(pickle.dumps(shipment)), _fresh("entries" if shipment.entries else "values"))
    return pickle.loads(pickle.dumps(verdict)).found


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["values", "entries"]), st.integers(0, 2**32), st.integers(4, 30))
def test_a_healthy_state_and_its_shipped_rerun_agree_for_any_arrival_order(kind, seed, n):
    rng = random.Random(seed)
    live = _state(kind)
    for batch, watermark in batches(rng, [(Meta(i, 0, 0, i), "abc"[i % 3], "kl"[i % 4 == 0]) for i in range(n)], advance=0.4):
        assert _shipped(live, batch, also=["l"] if rng.random() < 0.3 else ()) == []
        if watermark is not None:
            live.advance(watermark)
            if kind == "entries":
                live.backend.forget(live.logs)


def test_a_wrong_result_is_told_apart():
    live = _state("entries", lambda entries, x: _pages(entries, x) + "!")  # the live function computes wrong
    assert [m.kind for m in _shipped(live, [(Meta(1, 0, 0, 1), "a", "k")])] == ["output", "state"]  # the key's log holds its outputs


def test_a_state_gone_bad_as_the_batch_ran_is_told_apart():
    live = _state("values")
    shipment = ship(live, 0, batch := [(Meta(1, 0, 0, 1), "a", "k")])
    out = live.apply_items(batch)
    shipment.add_settled(live)
    live.logs["k"].after[-1] = "x"
    shipment.add_live(live, out)
    found = rerun(shipment, _fresh("values")).found
    assert [(m.kind, m.key) for m in found] == [("state", "k")] and found[0].live != found[0].copy


def test_a_record_the_live_run_never_read_is_a_difference():
    live = _state("entries")
    live.apply_items([(Meta(1, 0, 0, 1), "a", "k")])
    live.advance((2,))
    shipment = ship(live, 0, batch := [(Meta(3, 0, 0, 3), "c", "k")])
    out = live.apply_items(batch)
    shipment.add_settled(live, live.backend.read)
    shipment.add_live(live, out)
    del shipment.settled[("k", "a")]  # as if the live run had not read it: the re-run reads it unshipped
    found = rerun(shipment, _fresh("entries")).found
    assert ("read", ("k", "a")) in [(m.kind, m.key) for m in found]


def test_the_digest_does_not_depend_on_the_process_string_hashes():
    value = ({"x", "y", "zz", "w"}, {"b": 1, "a": {2, 3}}, [Meta(1, 0, 0, 1)])
    code = ("from driftstream.ordering.shipped_reexecution import canonical_digest; from driftstream.ordering.meta import Meta;"
            "print(canonical_digest(({'x', 'y', 'zz', 'w'}, {'b': 1, 'a': {2, 3}}, [Meta(1, 0, 0, 1)])))")
    digests = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True,
                              text=True, check=True).stdout.strip() for seed in (1, 2, 3)}
    assert digests == {str(canonical_digest(value))}
