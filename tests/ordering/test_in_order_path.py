"""The in-order path in C (``ordering/_drifting.c``): for any arrival order, batch split and
watermark, both forms of drifting keyed state give exactly what their Python gives (the
same outputs in the same order, the same backend, logs and counters, the same errors),
dead letters and tombstones included; the entry handle keeps MapState's contract."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering import keyed_state
from driftstream.ordering.accelerators import PURE_PYTHON as PURE
from driftstream.ordering.entry_state import DictEntryBackend, EntryKeyedState, MapState
from driftstream.ordering.keyed_state import DriftingKeyedState, StateFnError
from driftstream.ordering.meta import TOP, Meta

from tests.ordering.test_entry_state import flat_on_map, on_map
from tests.ordering.test_keyed_state import scenarios

native = pytest.mark.skipif(keyed_state._drifting is None, reason="the C path is not built (test_the_accelerator_is_built says why)")


def test_the_accelerator_is_built():
    """Without it the engine is correct but slower; a build that lost it must say so."""
    if PURE:
        pytest.skip("DRIFTSTREAM_PURE_PYTHON=1")
    assert keyed_state._drifting is not None, (
        "driftstream.ordering._drifting was not built: install with a C compiler (pip install -e .), "
        "or set DRIFTSTREAM_PURE_PYTHON=1 to run the tests on the Python alone")
    assert DriftingKeyedState._path is not None and EntryKeyedState._path is not None
    from driftstream.snapshots import state_cache

    assert state_cache._mark_clean is not None, "driftstream.snapshots._written was not built: as above"
    from driftstream.engine.connectors.kafka import record_batch

    assert record_batch.NATIVE is not None, "driftstream.engine.connectors.kafka._record_batch was not built: as above"
    from driftstream.ordering import sorted_queue

    assert sorted_queue._native is not None, "driftstream.ordering._sorted_queue was not built: as above"
    from driftstream.barriers import barrier

    assert barrier.NATIVE is not None, "driftstream.barriers._meta_sort was not built: as above"


def _raising(fn):
    """``fn``, raising on a payload with a 'w' (the earlier versions of corrected elements)."""

    def step(state, payload):
        if "w" in payload:
            raise ValueError(f"bad {payload}")
        return fn(state, payload)

    return step


def _concat(state, x):
    new = (state or "") + x
    return new, new


def _flat_concat(state, x):
    new = (state or "") + x
    return new, [new] * (len(new) % 3)


def _letter(meta, payload, exc):
    return ("dead", payload, type(exc).__name__)


def _make(form: str, on_error, python: bool):
    fns = {
        "values": (DriftingKeyedState, _raising(_concat), False),
        "values-flat": (DriftingKeyedState, _raising(_flat_concat), True),
        "entries": (EntryKeyedState, _raising(on_map), False),
        "entries-flat": (EntryKeyedState, _raising(flat_on_map), True),
    }
    cls, fn, flat = fns[form]
    ks = cls(fn, flat=flat, on_error=on_error)
    if python:
        ks._path = None  # this instance runs the reference
    return ks


def _run(ks, batches: list, advance: bool, after_batch=lambda: None, items: bool = False) -> list:
    """Every call's outcome: outputs, or the error's type and element (``after_batch()`` runs
    after each batch). ``items``: through ``apply_items``, its triples taken back to pairs."""
    seen = []
    undelivered = [d for b in batches for d in b]
    try:
        for batch in batches:
            if items:
                triples = ks.apply_items(list(batch))
                assert all(len(t) == 3 and t[2] is None for t in triples)
                seen.append(("out", [(m, p) for m, p, _ in triples]))
            else:
                seen.append(("out", ks.apply_batch(list(batch))))
            for d in batch:
                undelivered.remove(d)
            if advance and undelivered:
                ks.advance(min(m.time for m, _, _ in undelivered))
                seen.append(("sizes", ks.log_size(), len(ks.logs)))
            after_batch()
        ks.advance(TOP)
    except StateFnError as exc:
        seen.append(("error", exc.meta, exc.payload, type(exc.__cause__).__name__))
    return seen


def _state(ks) -> tuple:
    backend = sorted(ks.backend._data.items(), key=repr)
    overlay = sorted(getattr(ks, "overlay", {}).items(), key=repr)
    return (backend, overlay, ks.log_size(), sorted(ks.logs, key=repr), ks.tombstones_emitted, ks.out_of_order,
            sorted(ks.diverted, key=repr), sorted(ks.pending_tombstones.items(), key=repr))


@native
@pytest.mark.parametrize("form", ["values", "values-flat", "entries", "entries-flat"])
@pytest.mark.parametrize("dead_letters", [False, True])
@settings(max_examples=150, deadline=None)
@given(scenario=scenarios(), advance=st.booleans(), items=st.booleans())
def test_the_c_path_does_what_the_python_does(form, dead_letters, scenario, advance, items):
    """``items``: the C builds a keyed step's ``(meta, payload, None)`` items itself
    (``apply_items``), the Python converts its pairs: the same outputs either way."""
    _, batches = scenario
    on_error = _letter if dead_letters else None
    fast, reference = _make(form, on_error, python=False), _make(form, on_error, python=True)
    assert _run(fast, batches, advance, items=items) == _run(reference, batches, advance)
    assert _state(fast) == _state(reference)


def _no_python(*args):
    raise AssertionError("the C path called back the Python for a late element")


@native
def test_a_late_element_is_landed_and_its_tail_repaired_in_c():
    """Before its key's tail (a quarter of the index's elements when two files interleave), an
    element is inserted, the tail rolled back, re-applied and its changed outputs replaced in
    C: the class's ``_land`` and ``_emit_diff`` are not called (they cost ~5% of the index's
    stage, and a pass over the whole tail per late element)."""
    ks = DriftingKeyedState(_concat)
    assert ks.apply(Meta(2, 0, 0, 2), "b", "k") == [((2, 0, 0, 2, (), False), "b")]
    ks._land = ks._emit_diff = _no_python
    out = ks.apply(Meta(1, 0, 0, 1), "a", "k")
    assert [(m[0], m[5], p) for m, p in out] == [(1, False, "a"), (2, True, "b"), (2, False, "ab")]
    assert ks.out_of_order == 1 and ks.tombstones_emitted == 1
    ks.advance((3,))
    assert ks.log_size() == 0 and ks.backend.get("k") == "ab"


@native
def test_a_late_entry_element_undoes_the_tails_writes_in_c():
    def df(pages, x):
        pages.put(x, True)
        return [len(pages)]

    ks = EntryKeyedState(df, flat=True)
    ks.apply_batch([(Meta(t, 0, 0, t), f"p{t}", "w") for t in (2, 3, 5)])
    ks._land = ks._emit_diff = ks._roll_back = ks._undo = _no_python
    out = ks.apply_batch([(Meta(4, 0, 0, 4), "p4", "w"), (Meta(1, 0, 0, 1), "p1", "w")])
    assert [(m[0], m[5], p) for m, p in out] == [
        (1, False, 1), (2, True, 1), (2, False, 2), (3, True, 2), (3, False, 3), (4, False, 4), (5, True, 3), (5, False, 5)]
    assert ks.out_of_order == 2 and ks.tombstones_emitted == 3
    size = ("__driftstream_size__",)
    assert ks.overlay[("w", size)] == [1, 2, 3, 4, 5] and all(ks.overlay[("w", f"p{t}")] == [True] for t in range(1, 6))


@native
def test_a_handle_the_function_keeps_is_not_reused():
    """The C reuses an element's EntryHandle for the next only when nothing else holds it."""
    kept = []

    def keep(pages, x):
        kept.append(pages)
        pages.put(x, 1)
        return len(pages)

    ks = EntryKeyedState(keep)
    ks.apply_batch([(Meta(t, 0, 0, t), t, "k") for t in range(3)])
    assert len({id(h) for h in kept}) == 3
    assert [len(h) for h in kept] == [3, 3, 3]  # each reads the overlay as it is now


@native
def test_flat_outputs_get_child_metas_past_the_cached_ids():
    ks = DriftingKeyedState(lambda s, x: (s, list(range(x))), flat=True)
    out = ks.apply(Meta(1, 0, 0, 1, (3,)), 10, "k")
    assert [m for m, _ in out] == [(1, 0, 0, 1, (3, k), False) for k in range(10)]
    assert [p for _, p in out] == list(range(10))


@native
def test_the_entry_handle_keeps_mapstates_contract():
    seen = {}

    def fn(state, x):
        seen["handle"] = type(state).__name__
        if x == "put-none":
            state.put("a", None)
        if x == "put-size":
            state.put(("__driftstream_size__",), 1)
        state.put("a", 1)
        state.remove("missing")  # removing a missing entry writes nothing
        return (state.get("a"), state.get("b"), state.get("b", "dflt"), "a" in state, "b" in state, len(state))

    ks = EntryKeyedState(fn)
    assert ks.apply(Meta(1, 0, 0, 1), "x", "k")[0][1] == (1, None, "dflt", True, False, 1)
    assert seen["handle"] == "EntryHandle"
    assert ks.overlay[("k", "a")] == [1] and ("k", "missing") not in ks.overlay
    with pytest.raises(StateFnError) as info:
        ks.apply(Meta(2, 0, 0, 2), "put-none", "k")
    assert "cannot be None" in str(info.value.__cause__)
    with pytest.raises(StateFnError) as info:
        ks.apply(Meta(3, 0, 0, 3), "put-size", "j")
    assert "is reserved" in str(info.value.__cause__)


@native
@pytest.mark.parametrize("python", [False, True])
def test_entries_fold_into_any_backend_with_the_protocol(python):
    """One fold per advance, with every key's writes in log order, each record once with its last
    value where a key's whole log folds (the C and the Python)."""
    class Recording(DictEntryBackend):
        def __init__(self):
            super().__init__()
            self.calls = []

        def fold(self, writes):
            self.calls.append(list(writes))
            super().fold(writes)

    backend = Recording()
    ks = EntryKeyedState(lambda m, x: m.put(x, x) or len(m), backend=backend)
    if python:
        ks._path = None
    ks.apply_batch([(Meta(1, 0, 0, 1), "p", "k"), (Meta(2, 0, 0, 2), "q", "k"), (Meta(3, 0, 0, 3), "p", "j"),
                    (Meta(4, 0, 0, 4), "r", "i")])
    ks.advance((4,))
    size = ("__driftstream_size__",)  # a write that changes the count journals the size first
    assert backend.calls == [[(("k", size), 2), (("k", "p"), "p"), (("k", "q"), "q"),
                              (("j", size), 1), (("j", "p"), "p")]]
    assert ks.log_size() == 1 and set(ks.overlay) == {("i", "r"), ("i", size)}
    ks.advance((5,))
    assert len(backend.calls) == 2 and ks.advance((6,)) is None and len(backend.calls) == 2  # nothing folded: no call


def test_a_subclass_runs_the_python():
    class Logged(DriftingKeyedState):
        def _replay(self, key, log, i, out):
            self.replayed = key
            super()._replay(key, log, i, out)

    ks = Logged(_concat)
    assert ks._path is None
    ks.apply(Meta(1, 0, 0, 1), "a", "k")
    assert ks.replayed == "k"


def test_mapstate_is_what_a_step_declares_and_the_handle_what_it_gets():
    """``state=MapState`` stays the public marker; the handle a function sees has its methods."""
    if keyed_state._drifting is None:
        pytest.skip("no C path")
    handle = keyed_state._drifting.EntryHandle
    assert all(hasattr(handle, name) for name in ("get", "put", "remove", "__contains__", "__len__"))
    assert all(hasattr(MapState, name) for name in ("get", "put", "remove", "__contains__", "__len__"))


def _cached_entries(tmp: str, name: str):
    """Entry state's backend in a run: a StateCache over RocksDB, with a budget of one byte, so
    that every base drops what it wrote and later reads miss the cache (it is not complete)."""
    from driftstream.snapshots.backend import RocksDBBackend
    from driftstream.snapshots.entry_cache import CachedEntries
    from driftstream.snapshots.state_cache import StateCache

    return CachedEntries(StateCache(RocksDBBackend(f"{tmp}/{name}"), budget_bytes=1))


@native
@pytest.mark.parametrize("form", ["entries", "entries-flat"])
@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), advance=st.booleans(), bases=st.booleans())
def test_reads_through_the_caches_view_are_reads_through_its_get(tmp_path_factory, form, scenario, advance, bases):
    """The C reads a StateCache's decoded states itself (``read_view``), and a miss as no entry
    only while the cache is complete; the Python calls ``get``. Bases after each batch drop
    what they wrote, so reads go to RocksDB as well."""
    _, batches = scenario
    tmp = str(tmp_path_factory.mktemp("view"))
    runs = []
    for python in (False, True):
        ks = _make(form, None, python)
        ks.backend = _cached_entries(tmp, f"db-{python}")
        cache = ks.backend.cache

        def base():
            if bases:
                batch = cache.take_unwritten()
                cache.write(batch)
                cache.mark_written(batch)

        seen = _run(ks, batches, advance, base)
        runs.append((seen, sorted(cache.items(), key=repr), cache.complete if not bases else None))
        cache.close()
    assert runs[0] == runs[1]


def _forgot_the_tuple(state, x):
    return (state or "") + x  # the Quickstart's concat with `return new` for `return new, new`


@pytest.mark.parametrize("returned", ["yw", 7, ("s", "o", "x"), ["s", "o"], None])
@pytest.mark.parametrize("python", [False, True])
def test_a_state_function_that_returns_no_pair_fails_alike_on_both_paths(returned, python):
    """Only a tuple of two is ``(new_state, output)``: a 2-character string (a forgotten tuple),
    a list, an int or a triple fails with the same error on the C and the Python path."""
    if not python and keyed_state._drifting is None:
        pytest.skip("the C path is not built")
    ks = DriftingKeyedState(lambda state, x: returned)
    if python:
        ks._path = None
    with pytest.raises(StateFnError) as info:
        ks.apply_batch([(Meta(1, 0, 0, 1), "y", "k")])
    cause = info.value.__cause__
    assert type(cause) is TypeError
    assert str(cause) == f"a state function returns a tuple (new_state, output); this one returned {returned!r} (a {type(returned).__name__})"


def test_a_named_tuple_of_two_is_a_state_pair():
    from collections import namedtuple

    Pair = namedtuple("Pair", "state output")
    ks = DriftingKeyedState(lambda state, x: Pair((state or "") + x, x))
    assert [p for _, p in ks.apply_batch([(Meta(1, 0, 0, 1), "y", "k"), (Meta(2, 0, 0, 2), "w", "k")])] == ["y", "w"]


def _pages(pages, x):
    pages.put(x, True)
    return [len(pages)]


@pytest.mark.parametrize("python", [False, True])
@pytest.mark.parametrize("cls, fn, flat", [(DriftingKeyedState, _concat, False), (EntryKeyedState, _pages, True)])
def test_a_batch_in_t_order_gives_its_outputs_in_t_order(python, cls, fn, flat):
    """An element at the tail of a key the batch has not touched is applied as it lands: the
    outputs follow the batch, not its keys (a sink's barrier or the next stage's merge then
    gets them sorted), on the C and the Python path; a late one still waits for the batch."""
    if not python and keyed_state._drifting is None:
        pytest.skip("the C path is not built")
    ks = cls(fn, flat=flat)
    if python:
        ks._path = None
    items = [(Meta(t, 0, 0, t), f"x{t}", key) for t, key in enumerate("abab", start=2)]
    assert [m[0] for m, _ in ks.apply_batch(items)] == [2, 3, 4, 5]
    late = [(Meta(6, 0, 0, 6), "y6", "a"), (Meta(1, 0, 0, 1), "y1", "b"), (Meta(7, 0, 0, 7), "y7", "c")]
    out = [(m[0], m[5]) for m, _ in ks.apply_batch(late)]
    assert out[:2] == [(6, False), (7, False)]  # b's repair comes when the batch has landed
    assert out[2:] == [(1, False), (3, True), (3, False), (5, True), (5, False)] and ks.out_of_order == 1
