"""Deltas: replaying a base's deltas gives the states at the last of them, whether a key
is recorded by its inputs or its state (pure logic: codec, msgpack, no files)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.ordering.key_groups import GroupRange, KeyGroups
from driftstream.snapshots.changelog import MAX_INPUTS, DeltaError, decode_delta, delta_rows, encode_delta, replay_deltas
from driftstream.snapshots.codec import encode, encode_key
from driftstream.snapshots.state_keys import StateKeys

KEYS = StateKeys()

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
                deltas.append(decode_delta(encode_delta(changes, KEYS)))
            changes, expected = {}, dict(states)
    replayed = replay_deltas(deltas, lambda k: base.get(KEYS.decode(k)), append)
    restored = {**base, **{KEYS.decode(k): v for k, v in replayed.items()}}
    assert restored == expected


def test_a_key_is_recorded_by_its_state_when_its_inputs_are_many_or_not_encodable():
    rows = decode_delta(
        encode_delta(
            {
                "few": ((1, 2), [1, 2]),
                "many": (7, list(range(MAX_INPUTS + 1))),
                "odd": (3, [object()]),  # the codec refuses it; the state is fine
            },
            KEYS,
        )
    )
    assert [kind for _, kind, _ in rows] == ["inputs", "state", "state"]


def test_a_delta_from_another_format_is_refused():
    import msgpack

    with pytest.raises(DeltaError, match="delta format 1"):
        decode_delta(msgpack.packb([1, [[b"k", b"v"]]]))


def test_rows_are_keyed_by_key_group_and_a_range_reads_only_its_groups():
    keys = StateKeys(KeyGroups(16))
    words = [f"w{i}" for i in range(60)]
    data = encode_delta({w: (i, [i]) for i, w in enumerate(words)}, keys)
    for start in range(0, 16, 5):
        groups = GroupRange(start, start + 5)
        got = {keys.decode(k) for k, _, _ in delta_rows(data, keys, groups)}
        assert got == {w for w in words if keys.group_of(w) in groups}


def test_a_delta_from_before_key_groups_is_regrouped_as_it_is_read():
    """Format 3 rows are keyed by encode_key alone: read, each key gets its group prefix, so a
    snapshot from before key groups restores into any range."""
    import msgpack

    keys = StateKeys(KeyGroups(8), routing_key=lambda k: k[0])  # windows: (key, start, end)
    legacy = msgpack.packb([3, [[encode_key(("a", 0, 10)), 0, encode(5)], [encode_key(("b", 0, 10)), 2, b""]]], use_bin_type=True)
    rows = delta_rows(legacy, keys)
    assert [(keys.group(k), keys.decode(k), kind) for k, kind, _ in rows] == [
        (KeyGroups(8).group_of("a"), ("a", 0, 10), "state"), (KeyGroups(8).group_of("b"), ("b", 0, 10), "removed")]
    assert rows[0][0] == keys.encode(("a", 0, 10))  # the same bytes a new delta or RocksDB holds
