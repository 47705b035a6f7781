"""StateKeys: a stored key is its key group, then the encoded state key, however many keys are encoded at once."""

from __future__ import annotations

from hypothesis import given, strategies as st

from driftstream.ordering.key_groups import KeyGroups
from driftstream.snapshots import state_keys
from driftstream.snapshots.state_keys import StateKeys, first

entry_keys = st.tuples(st.sampled_from(["the", "a", "é" * 40, "x" * 260, ""]), st.one_of(st.integers(-2**70, 2**70), st.text(max_size=3)))


@given(st.lists(entry_keys, max_size=60))
def test_a_base_s_keys_encoded_together_are_the_keys_encoded_one_by_one(keys):
    layout = StateKeys(KeyGroups(16), routing_key=first)
    assert layout.encode_many(keys) == [layout.encode(k) for k in keys]
    assert [layout.decode(raw) for raw in layout.encode_many(keys)] == keys
    assert [layout.group(raw) for raw in layout.encode_many(keys)] == [KeyGroups(16).group_of(k[0]) for k in keys]


def test_the_cache_of_routing_keys_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(state_keys, "STARTS_KEPT", 3)
    layout = StateKeys(KeyGroups(16), routing_key=first)
    keys = [(f"w{i % 5}", i) for i in range(40)]
    assert layout.encode_many(keys) == [layout.encode(k) for k in keys]
    assert len(layout._starts) <= 3


def test_keys_of_another_routing_key_take_the_general_path():
    layout = StateKeys(KeyGroups(16), routing_key=lambda key: key[1])
    keys = [("a", "k1"), ("b", "k1"), ("a", "k2")]
    assert layout.encode_many(keys) == [layout.encode(k) for k in keys]
    assert layout.group(layout.encode_many(keys)[0]) == KeyGroups(16).group_of("k1")
