"""Deltas: replaying a base's deltas gives the states at the last of them, whether a key
is recorded by its inputs or its state (pure logic: codec, msgpack, no files)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.snapshots.changelog import MAX_INPUTS, DeltaError, decode_delta, encode_delta, replay_deltas
from driftstream.snapshots.codec import encode_key

import pytest


def append(state, x):
    """Order-sensitive: the state is the sequence of inputs."""
    return (state or ()) + (x,), len(state or ())


# One operation: fold inputs into a key, set a key's state outright, or take a snapshot.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("fold"), st.sampled_from("abc"), st.lists(st.integers(0, 9), min_size=1, max_size=4)),
        st.tuples(st.just("put"), st.sampled_from("abc"), st.lists(st.integers(0, 9), max_size=3)),
        st.tuples(st.just("snapshot")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abc"), st.lists(st.integers(0, 9), max_size=3).map(tuple)), ops)
def test_replaying_the_deltas_on_the_base_gives_the_states_of_the_last_snapshot(base, history):
    states = dict(base)
    changes: dict = {}  # like StateCache: key -> (state, inputs since the last snapshot or None)
    deltas: list = []
    expected = dict(states)
    for op in history + [("snapshot",)]:
        if op[0] == "fold":
            _, key, inputs = op
            state = states.get(key)
            for x in inputs:
                state = append(state, x)[0]
            states[key] = state
            prev = changes.get(key, (None, []))[1]
            changes[key] = (state, None if prev is None else prev + inputs)
        elif op[0] == "put":
            states[op[1]] = tuple(op[2])
            changes[op[1]] = (tuple(op[2]), None)
        else:
            if changes:
                deltas.append(decode_delta(encode_delta(changes)))
            changes, expected = {}, dict(states)
    replayed = replay_deltas(deltas, lambda k: base.get({encode_key(c): c for c in "abc"}[k]), append)
    restored = {**base, **{{encode_key(c): c for c in "abc"}[k]: v for k, v in replayed.items()}}
    assert restored == expected


def test_a_key_is_recorded_by_its_state_when_its_inputs_are_many_or_not_encodable():
    rows = decode_delta(
        encode_delta(
            {
                "few": ((1, 2), [1, 2]),
                "many": (7, list(range(MAX_INPUTS + 1))),
                "odd": (3, [object()]),  # the codec refuses it; the state is fine
            }
        )
    )
    assert [kind for _, kind, _ in rows] == ["inputs", "state", "state"]


def test_a_delta_from_another_format_is_refused():
    import msgpack

    with pytest.raises(DeltaError, match="delta format 1"):
        decode_delta(msgpack.packb([1, [[b"k", b"v"]]]))
