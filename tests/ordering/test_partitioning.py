"""stable_hash: the same in every process (whatever PYTHONHASHSEED), equal keys hash
equal, and keys without a stable hash raise UnhashableKeyError naming their type."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.ordering.partitioning import UnhashableKeyError, stable_hash

KEYS = [
    "",
    "apple",
    "ünïcødé ✓",
    "\ud800",  # a lone surrogate
    b"",
    b"\x00\xffbytes",
    0,
    1,
    -1,
    2**63,
    -(2**127),
    2**127,  # beyond 128-bit: hashed through its decimal form
    -(2**200),
    True,
    False,
    None,
    0.5,
    -2.25,
    1e300,
    float("inf"),
    float("-inf"),
    (),
    ("a", 1),
    ("a", ("b", (None, b"c", 2.5)), True),
]

# The keys travel to the child process pickled (hex on stdin); the hashes come back as JSON.
_CHILD = """
import json, pickle, sys
from driftstream.ordering.partitioning import stable_hash
keys = pickle.loads(bytes.fromhex(sys.stdin.read()))
print(json.dumps([stable_hash(k) for k in keys]))
"""


def _hashes_in_subprocess(keys, hashseed):
    env = dict(os.environ, PYTHONHASHSEED=str(hashseed))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], input=pickle.dumps(keys).hex(), env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(proc.stdout)


def test_same_hash_in_a_process_with_another_hash_seed():
    here = [stable_hash(k) for k in KEYS]
    assert _hashes_in_subprocess(KEYS, 123) == here
    # Sanity check that the subprocess really salts str differently from us.
    env = dict(os.environ, PYTHONHASHSEED="123")
    other = subprocess.run([sys.executable, "-c", "print(hash('apple'))"], env=env, capture_output=True, text=True, check=True)
    env["PYTHONHASHSEED"] = "124"
    another = subprocess.run([sys.executable, "-c", "print(hash('apple'))"], env=env, capture_output=True, text=True, check=True)
    assert other.stdout != another.stdout


def test_known_values_do_not_drift():
    """Pinned values: a change here moves every key to another instance (and breaks restoring snapshots)."""
    assert stable_hash("apple") == 2838417488
    assert stable_hash(7) == 289583904
    assert stable_hash(-1) == 1068746266
    assert stable_hash(("a", 1)) == 1186786701
    assert stable_hash(0.5) == 2867784343
    assert stable_hash("") == 0
    assert stable_hash(None) == 0x9E3779B1
    assert stable_hash(b"") == 0x5BD1E995


def test_hash_is_a_32_bit_unsigned_int():
    for k in KEYS:
        h = stable_hash(k)
        assert type(h) is int and 0 <= h < 2**32, k


hashable_keys = st.recursive(
    st.one_of(st.text(max_size=5), st.binary(max_size=5), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(hashable_keys)
def test_equal_values_hash_equal(key):
    copy = pickle.loads(pickle.dumps(key))  # a fresh, equal object
    assert copy == key
    assert stable_hash(copy) == stable_hash(key)


def test_different_values_usually_hash_differently():
    keys = [f"key-{i}" for i in range(1000)] + list(range(1000)) + [("k", i) for i in range(1000)]
    assert len({stable_hash(k) for k in keys}) > 2990
    # and spread over instances
    counts = [0] * 4
    for i in range(1000):
        counts[stable_hash(f"key-{i}") % 4] += 1
    assert min(counts) > 200


def test_str_and_bytes_and_tuple_are_distinguished():
    assert stable_hash("a") != stable_hash(b"a")
    assert stable_hash(("a",)) != stable_hash("a")
    assert stable_hash(("a", "b")) != stable_hash(("b", "a"))
    assert stable_hash((("a",), "b")) != stable_hash(("a", ("b",)))


def test_keys_equal_in_python_hash_equal():
    """key_by keys that are ``==`` share one state in a dict, so they must also meet in one instance."""
    assert stable_hash(True) == stable_hash(1)
    assert stable_hash(False) == stable_hash(0)
    assert stable_hash(0.0) == stable_hash(0) == stable_hash(-0.0)
    assert stable_hash(1.0) == stable_hash(1)
    assert stable_hash(-3.0) == stable_hash(-3)
    assert stable_hash(2.0**100) == stable_hash(2**100)
    assert stable_hash(("a", 2.0)) == stable_hash(("a", 2))


@settings(max_examples=150, deadline=None)
@given(st.integers(-(2**140), 2**140))
def test_integral_floats_hash_like_the_int(n):
    f = float(n)
    if f == n:
        assert stable_hash(f) == stable_hash(n)


@pytest.mark.parametrize(
    "key, type_name",
    [([1, 2], "list"), ({"a": 1}, "dict"), ({1}, "set"), (frozenset(), "frozenset"), (object(), "object"), (1j, "complex"), (bytearray(b"x"), "bytearray")],
)
def test_unsupported_key_types_raise_naming_the_type(key, type_name):
    with pytest.raises(UnhashableKeyError) as info:
        stable_hash(key)
    assert type_name in str(info.value)
    assert isinstance(info.value, TypeError)


def test_unsupported_type_inside_a_tuple_is_named():
    with pytest.raises(UnhashableKeyError, match="list"):
        stable_hash(("ok", ["not", "ok"]))


def test_subclasses_are_not_silently_accepted():
    class MyStr(str):
        pass

    with pytest.raises(UnhashableKeyError, match="MyStr"):
        stable_hash(MyStr("a"))
