"""DriftingKeyedState: any arrival order of elements and tombstones, in any batch split,
nets out to the in-order result; rollback, tombstones, ``advance`` and StateFnError."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering.keyed_state import DictBackend, DriftingKeyedState, StateFnError
from driftstream.ordering.meta import TOP, Meta

# -- non-commutative state functions ---------------------------------------------------


def concat(state, x):
    new = (state or "") + x
    return new, new


def append(state, x):
    new = (state or ()) + (x,)
    return new, new


def concat_sometimes_silent(state, x):
    """A stateful_map whose output is None (nothing emitted) for some states."""
    new = (state or "") + x
    return new, (None if len(new) % 3 == 0 else f"{x}@{new}")


def flat_variable(state, x):
    """stateful_flat_map: 0..3 outputs, their number and values depend on the state."""
    new = (state or "") + x
    return new, [f"{new}:{j}" for j in range(len(new) % 4)]


FUNCTIONS = {
    "concat": (concat, False),
    "append": (append, False),
    "silent": (concat_sometimes_silent, False),
    "flat": (flat_variable, True),
}


def reference(items, fn, flat):
    """Apply the elements per key in Meta order: ``(outputs sorted by Meta, final states)``."""
    states: dict = {}
    out = []
    for meta, payload, key in sorted(items, key=lambda e: e[0]):
        states[key], result = fn(states.get(key), payload)
        if flat:
            out += [(meta.child(k), y) for k, y in enumerate(result or [])]
        elif result is not None:
            out.append((meta, result))
    return sorted(out, key=lambda e: e[0]), states


class NetOutput:
    """Everything emitted, as a multiset: a tombstone cancels one equal element."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def feed(self, emitted) -> None:
        for meta, payload in emitted:
            meta = Meta(*meta)  # emitted metas may be plain 6-tuples
            k = (meta.invalidee(), payload)
            self.counts[k] += -1 if meta.tombstone else 1
            # A keyed state only retracts what it emitted before.
            assert self.counts[k] >= 0, f"tombstone {meta} {payload!r} for an output never emitted"

    def net(self) -> list:
        out = [k for k, n in self.counts.items() for _ in range(n)]
        return sorted(out, key=lambda e: e[0])


# -- strategies ------------------------------------------------------------------------

meta_keys = st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(0, 2), st.lists(st.integers(0, 1), max_size=2).map(tuple))


@st.composite
def scenarios(draw, retractions: bool = True):
    """``(final elements, deliveries)``: with ``retractions``, deliveries also hold, for
    some times, an earlier version plus its tombstone (an upstream correction, with
    or without a replacement), all in a random order and split into random batches."""
    raw = draw(st.lists(meta_keys, min_size=1, max_size=12, unique=True))
    final, deliveries = [], []
    for ts, part, off, child in raw:
        meta = Meta(ts, 0, part, off, child)
        key = draw(st.sampled_from("abc"))
        kind = draw(st.sampled_from(["plain", "corrected", "retracted"])) if retractions else "plain"
        if kind != "plain":
            old = draw(st.text("xyzw", min_size=1, max_size=2))
            deliveries += [(meta, old, key), (meta.as_tombstone(), old, key)]
        if kind != "retracted":
            payload = draw(st.text("xyz", min_size=1, max_size=2))
            final.append((meta, payload, key))
            deliveries.append((meta, payload, key))
    order = draw(st.permutations(deliveries))
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=5)))
    batches = [order[i:j] for i, j in zip([0] + cuts, cuts + [len(order)])]
    return final, [b for b in batches if b]


def deliver(ks, batches: list, advance: bool, after_batch=lambda: None) -> NetOutput:
    """Feed ``batches`` to ``ks``; with ``advance``, move the watermark after each batch as far
    as is legal (every time below it has fully arrived); ``after_batch()`` runs after each
    (e.g. a snapshot's base). Returns the net output."""
    net = NetOutput()
    undelivered = [d for b in batches for d in b]
    for batch in batches:
        net.feed(ks.apply_batch(list(batch)))
        for d in batch:
            undelivered.remove(d)
        if advance and undelivered:
            ks.advance(min(m.time for m, _, _ in undelivered))
        after_batch()
    return net


# -- the main property -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@settings(max_examples=150, deadline=None)
@given(scenario=scenarios(), advance=st.booleans())
def test_any_arrival_order_nets_out_to_the_in_order_result(name, scenario, advance):
    fn, flat = FUNCTIONS[name]
    final, batches = scenario
    ks = DriftingKeyedState(fn, flat=flat)
    net = deliver(ks, batches, advance)
    expected_out, expected_states = reference(final, fn, flat)
    assert net.net() == expected_out
    assert not ks.pending_tombstones
    ks.advance(TOP)
    assert ks.log_size() == 0 and not ks.logs
    for key in "abc":
        assert ks.backend.get(key) == expected_states.get(key)


@settings(max_examples=150, deadline=None)
@given(scenario=scenarios(retractions=False))
def test_one_element_at_a_time_in_any_order(scenario):
    """``apply`` one by one (no batching), no corrections: same net output."""
    final, batches = scenario
    ks = DriftingKeyedState(concat)
    net = NetOutput()
    for batch in batches:
        for meta, payload, key in batch:
            net.feed(ks.apply(meta, payload, key))
    assert net.net() == reference(final, concat, False)[0]


@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(retractions=False))
def test_in_order_arrival_emits_no_tombstones(scenario):
    final, _ = scenario
    ks = DriftingKeyedState(concat)
    out = []
    for meta, payload, key in sorted(final, key=lambda e: e[0]):
        out += ks.apply(meta, payload, key)
    assert ks.tombstones_emitted == 0
    assert out == reference(final, concat, False)[0]


# -- unit tests ------------------------------------------------------------------------


def M(ts, *child):
    return Meta(ts, 0, 0, ts, tuple(child))


def test_in_order_outputs_reuse_the_input_meta():
    ks = DriftingKeyedState(concat)
    assert ks.apply(M(1), "a", "k") == [(M(1), "a")]
    assert ks.apply(M(2), "b", "k") == [(M(2), "ab")]
    assert ks.log_size() == 2


def test_late_element_rolls_back_and_invalidates_only_changed_outputs():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k")
    ks.apply(M(3), "c", "k")
    out = ks.apply(M(2), "b", "k")
    assert out == [(M(2), "ab"), (M(3).as_tombstone(), "ac"), (M(3), "abc")]
    assert ks.tombstones_emitted == 1
    assert ks.out_of_order == 1  # only the element that landed before the tail


def test_late_element_whose_successors_do_not_change_emits_no_tombstone():
    def count_upper(n, x):
        return (n or 0) + 1, x.upper()  # output independent of the state

    ks = DriftingKeyedState(count_upper)
    ks.apply(M(2), "b", "k")
    ks.apply(M(3), "c", "k")
    assert ks.apply(M(1), "a", "k") == [(M(1), "A")]
    assert ks.tombstones_emitted == 0
    assert ks.out_of_order == 1  # rolled back and re-applied, though no output changed
    ks.advance(TOP)
    assert ks.backend.get("k") == 3


def test_keys_are_independent():
    calls = []

    def spy(state, x):
        calls.append(x)
        return concat(state, x)

    ks = DriftingKeyedState(spy)
    for t, x in [(2, "b"), (3, "c"), (4, "d")]:
        ks.apply(M(t), x, "other")
    ks.apply(M(5), "e", "k")
    calls.clear()
    out = ks.apply(M(1), "a", "k")  # late for time, but first of key "k"
    assert calls == ["a", "e"]
    assert out == [(M(1), "a"), (M(5).as_tombstone(), "e"), (M(5), "ae")]


def test_tombstone_removes_element_and_reapplies_the_tail():
    ks = DriftingKeyedState(concat)
    for t, x in [(1, "a"), (2, "b"), (3, "c")]:
        ks.apply(M(t), x, "k")
    out = ks.apply(M(2).as_tombstone(), "b", "k")
    assert out == [(M(2).as_tombstone(), "ab"), (M(3).as_tombstone(), "abc"), (M(3), "ac")]
    assert ks.log_size() == 2
    ks.advance(TOP)
    assert ks.backend.get("k") == "ac"


def test_tombstone_of_the_only_element_empties_the_key():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k")
    assert ks.apply(M(1).as_tombstone(), "a", "k") == [(M(1).as_tombstone(), "a")]
    assert ks.log_size() == 0 and "k" not in ks.logs
    assert ks.apply(M(2), "b", "k") == [(M(2), "b")]


def test_tombstone_before_its_invalidee_annihilates():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k")
    assert ks.apply(M(2).as_tombstone(), "b", "k") == []
    assert ks.pending_tombstones == {"k": [(M(2), "b")]}
    assert ks.apply(M(2), "b", "k") == []  # the pair cancels: nothing emitted, nothing logged
    assert ks.pending_tombstones == {}
    assert ks.log_size() == 1
    assert ks.apply(M(3), "c", "k") == [(M(3), "ac")]


def test_tombstone_matches_payload_not_just_meta():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "new", "k")
    assert ks.apply(M(1).as_tombstone(), "old", "k") == []  # waits for (M(1), "old")
    assert ks.log_size() == 1
    assert ks.apply(M(1), "old", "k") == []
    assert ks.log_size() == 1 and not ks.pending_tombstones
    ks.advance(TOP)
    assert ks.backend.get("k") == "new"


def test_tombstone_matches_key():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k1")
    assert ks.apply(M(1).as_tombstone(), "a", "k2") == []
    assert ks.log_size() == 1 and ks.pending_tombstones == {"k2": [(M(1), "a")]}


def test_batch_with_tombstone_and_replacement_reapplies_the_tail_once():
    calls = []

    def spy(state, x):
        calls.append(x)
        return concat(state, x)

    ks = DriftingKeyedState(spy)
    for t, x in [(1, "a"), (2, "b"), (3, "c"), (4, "d")]:
        ks.apply(M(t), x, "k")
    calls.clear()
    out = ks.apply_batch([(M(1).as_tombstone(), "a", "k"), (M(1), "A", "k")])
    assert calls == ["A", "b", "c", "d"]
    net = NetOutput()
    net.feed([(M(t), s) for t, s in [(1, "a"), (2, "ab"), (3, "abc"), (4, "abcd")]])
    net.feed(out)
    assert net.net() == [(M(1), "A"), (M(2), "Ab"), (M(3), "Abc"), (M(4), "Abcd")]


def test_flat_outputs_get_child_metas_and_late_arrival_fixes_their_number():
    ks = DriftingKeyedState(flat_variable, flat=True)
    assert ks.apply(M(2), "b", "k") == [(M(2, 0), "b:0")]
    out = ks.apply(M(1), "a", "k")
    # "a" -> 1 output; "ab" -> 2 outputs: child 0 changed, child 1 is new.
    assert out == [(M(1, 0), "a:0"), (M(2, 0).as_tombstone(), "b:0"), (M(2, 0), "ab:0"), (M(2, 1), "ab:1")]
    out = ks.apply(M(0), "xy", "k")  # "xya" -> 3 outputs, "xyab" -> 0 outputs
    net = NetOutput()
    net.feed([(M(1, 0), "a:0"), (M(2, 0), "ab:0"), (M(2, 1), "ab:1")])
    net.feed(out)
    assert net.net() == [(M(0, 0), "xy:0"), (M(0, 1), "xy:1"), (M(1, 0), "xya:0"), (M(1, 1), "xya:1"), (M(1, 2), "xya:2")]


def test_flat_function_returning_none_emits_nothing():
    ks = DriftingKeyedState(lambda s, x: (x, None), flat=True)
    assert ks.apply(M(1), "a", "k") == []
    ks.advance(TOP)
    assert ks.backend.get("k") == "a"


def test_advance_folds_into_the_backend_and_shrinks_the_log():
    ks = DriftingKeyedState(concat)
    for t, x, k in [(1, "a", "k"), (2, "b", "j"), (3, "c", "k"), (4, "d", "j"), (5, "e", "k")]:
        ks.apply(M(t), x, k)
    assert ks.log_size() == 5
    ks.advance((1,))  # nothing below time 1
    assert ks.log_size() == 5 and ks.backend.get("k") is None
    ks.advance((3,))
    assert ks.log_size() == 3
    assert ks.backend.get("k") == "a" and ks.backend.get("j") == "b"
    ks.advance((5, 0, 0, 5))  # exclusive: time 5 stays
    assert ks.log_size() == 1
    assert ks.backend.get("k") == "ac" and ks.backend.get("j") == "bd"
    assert "j" not in ks.logs
    ks.advance(TOP)
    assert ks.log_size() == 0 and ks.logs == {}
    assert ks.backend.get("k") == "ace"


def test_state_after_advance_and_later_elements():
    ks = DriftingKeyedState(concat)
    for t, x in [(1, "a"), (2, "b"), (4, "d")]:
        ks.apply(M(t), x, "k")
    ks.advance((3,))
    assert ks.log_size() == 1
    # Late, but at or above the watermark: rolls back to the settled state, not to None.
    out = ks.apply(M(3), "c", "k")
    assert out == [(M(3), "abc"), (M(4).as_tombstone(), "abd"), (M(4), "abcd")]
    assert ks.apply(M(5), "e", "k") == [(M(5), "abcde")]
    ks.advance((6,))
    assert ks.backend.get("k") == "abcde" and ks.log_size() == 0
    # Once everything is folded, a new element starts from the backend's state.
    assert ks.apply(M(7), "f", "k") == [(M(7), "abcdef")]


def test_advance_keeps_entries_removed_by_tombstones_out_of_the_backend():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k")
    ks.apply(M(2), "b", "k")
    ks.apply(M(2).as_tombstone(), "b", "k")
    ks.advance((3,))
    assert ks.backend.get("k") == "a" and ks.log_size() == 0


def test_advance_after_the_head_of_a_key_was_retracted():
    ks = DriftingKeyedState(concat)
    ks.apply(M(1), "a", "k")
    ks.apply(M(5), "e", "k")
    ks.apply(M(1).as_tombstone(), "a", "k")  # the key's first entry goes
    ks.advance((3,))  # nothing of "k" is below 3 now
    assert ks.log_size() == 1
    ks.advance((6,))
    assert ks.log_size() == 0 and ks.backend.get("k") == "e"


def test_custom_backend_is_used():
    class Recording(DictBackend):
        def __init__(self):
            super().__init__()
            self.puts = []

        def fold(self, key, state, inputs):
            self.puts.append((key, state, inputs))
            super().fold(key, state, inputs)

    backend = Recording()
    backend.put("k", "base")
    ks = DriftingKeyedState(concat, backend=backend)
    assert ks.backend is backend
    assert ks.apply(M(2), "b", "k") == [(M(2), "baseb")]
    ks.apply(M(1), "a", "k")  # late: the fold still gets the inputs in order
    ks.advance(TOP)
    assert backend.puts == [("k", "baseab", ["a", "b"])]


def test_unmatched_tombstone_below_the_watermark_is_an_error():
    ks = DriftingKeyedState(concat)
    ks.apply(M(10).as_tombstone(), "x", "k")
    ks.apply(M(1).as_tombstone(), "y", "k")  # its element never comes
    with pytest.raises(AssertionError):
        ks.advance((5,))


def test_state_fn_error_names_the_failing_element():
    def picky(state, x):
        if x == "bad":
            raise ValueError("no bad input")
        return concat(state, x)

    ks = DriftingKeyedState(picky)
    ks.apply(M(1), "a", "k")
    with pytest.raises(StateFnError) as info:
        ks.apply(M(2), "bad", "k")
    err = info.value
    assert err.meta == M(2) and err.payload == "bad"
    assert isinstance(err.__cause__, ValueError) and "no bad input" in str(err.__cause__)


def test_state_fn_error_during_reapplication_names_the_tail_element():
    def limited(state, x):
        if len(state or "") >= 2:
            raise RuntimeError("state too long")
        return concat(state, x)

    ks = DriftingKeyedState(limited)
    ks.apply(M(2), "b", "k")
    ks.apply(M(3), "c", "k")  # state "b" -> "bc": fine
    with pytest.raises(StateFnError) as info:
        ks.apply(M(1), "a", "k")  # re-applying: "a", "ab", then "c" on "ab" fails
    assert info.value.meta == M(3) and info.value.payload == "c"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_state_fn_error_from_a_flat_function_returning_a_non_iterable():
    ks = DriftingKeyedState(lambda s, x: (s, 42), flat=True)
    with pytest.raises(StateFnError) as info:
        ks.apply(M(1), "a", "k")
    assert info.value.meta == M(1) and isinstance(info.value.__cause__, TypeError)
