"""codec: every supported value round-trips with its exact types, the bytes are
deterministic across processes, equal keys share one encoding, anything else is
refused with a TypeError, and no input makes decode fail with anything but DecodeError."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from collections import defaultdict, namedtuple

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.snapshots import codec
from driftstream.snapshots.codec import DecodeError, decode, encode, encode_key, encode_keys, encode_many, encode_pairs, pair_start

# -- strategies ---------------------------------------------------------------------------

ints = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-(2**63) - 1, -(2**63), 2**63 - 1, 2**63, -(2**31) - 1, -(2**31), 2**31 - 1, 2**31, -129, -128, 127, 128]),
)
scalars = st.one_of(
    st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True), st.text(), st.binary(),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),  # lone surrogates
)
hashables = st.recursive(
    scalars,
    lambda inner: st.one_of(st.tuples(inner, inner), st.lists(inner, max_size=4).map(tuple), st.frozensets(inner, max_size=4)),
    max_leaves=8,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=6).map(tuple),
        st.lists(ints, min_size=2, max_size=8),  # the packed-int-list paths
        st.lists(ints, min_size=2, max_size=8).map(tuple),
        st.dictionaries(hashables, inner, max_size=5),
        st.sets(hashables, max_size=5),
        st.frozensets(hashables, max_size=5),
    ),
    max_leaves=30,
)


def same(a, b) -> bool:
    """Equal with the same types throughout, dict order included; nan equals nan, -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(same(k1, k2) and same(v1, v2) for (k1, v1), (k2, v2) in zip(a.items(), b.items()))
    if type(a) in (set, frozenset):  # elements compared through their (already checked) encodings
        return sorted(encode(x) for x in a) == sorted(encode(x) for x in b)
    return a == b


# -- round trip ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(values)
def test_round_trip_keeps_values_and_types(value):
    data = encode(value)
    back = decode(data)
    assert same(back, value)
    assert encode(back) == data  # decoding loses nothing the encoding depends on


@given(hashables)
def test_keys_round_trip_to_an_equal_canonical_key(key):
    back = decode(encode_key(key))
    if not _has_nan(key):
        assert back == key and hash(back) == hash(key)
    assert encode_key(back) == encode_key(key)


_plain_key_parts = st.one_of(st.text(max_size=40), st.integers(), st.integers(min_value=-2**70, max_value=2**70))


@given(st.one_of(
    st.lists(_plain_key_parts, max_size=6).map(tuple),
    # payload lengths around every extension header size: fixext 1..16, ext 8/16/32
    st.tuples(st.sampled_from([0, 1, 2, 3, 6, 13, 14, 240, 250, 253, 254, 65_520, 65_530, 65_533, 65_534, 70_000]),
              st.integers(0, 4)).map(lambda nk: ("x" * nk[0],) + tuple(range(nk[1]))),
))
def test_a_key_tuple_of_str_and_int_encodes_as_messagepack_does(key):
    # encode_key writes a plain tuple's extension header itself (the fast path of entry
    # keys); encode goes through MessagePack's own default callback
    assert encode_key(key) == encode(key)
    assert decode(encode_key(key)) == key


@given(st.lists(st.one_of(hashables, st.tuples(st.text(max_size=300), st.one_of(st.integers(), st.booleans())),
                         st.tuples(st.sampled_from(["x" * n for n in (1, 13, 14, 240, 250, 254, 260)]), st.integers(0, 2**64)))))
def test_keys_encoded_together_are_the_keys_encoded_one_by_one(keys):
    # encode_keys packs (str, int) pairs itself, a base's keys in one call
    assert encode_keys(keys) == [encode_key(k) for k in keys]


@given(st.lists(values, max_size=8))
def test_values_encoded_together_are_the_values_encoded_one_by_one(vals):
    assert encode_many(vals) == [encode(v) for v in vals]


@given(st.lists(st.one_of(hashables, st.tuples(st.text(max_size=300), st.one_of(st.integers(), st.booleans(), hashables)),
                         st.tuples(st.sampled_from(["x" * n for n in (1, 13, 14, 240, 250, 254, 260)]),
                                   st.one_of(st.integers(-2**70, 2**70), st.just(("__driftstream_size__",)))))))
def test_pairs_encoded_from_a_cache_of_their_starts_are_the_keys_encoded_one_by_one(keys):
    # a base's entry keys: the packed str comes from the caller's cache, only the second item
    # is packed (entry state's size entry, a tuple, once per call)
    starts: dict = {}

    def start_of(s):
        starts[s] = (b"P", pair_start(s))
        return starts[s]

    twice = keys + keys  # the second time every start comes from the cache
    assert encode_pairs(twice, starts, start_of, lambda k: b"P" + encode_key(k)) == [b"P" + encode_key(k) for k in twice]


_int_edges = st.sampled_from([0, 1, 31, 32, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
                              2**64, -1, -31, -32, -33, -128, -129, -32_768, -32_769, -(2**31), -(2**31) - 1, -(2**63),
                              -(2**63) - 1])


@pytest.mark.skipif(codec._pair_keys is None, reason="snapshots._written is not built (test_the_accelerator_is_built says why)")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(hashables, st.tuples(st.text(max_size=300), st.one_of(_int_edges, st.integers(), st.booleans(), hashables)),
                         st.tuples(st.sampled_from(["x" * n for n in (1, 13, 14, 240, 250, 254, 260)]),
                                   st.one_of(_int_edges, st.just(("__driftstream_size__",)), st.floats(allow_nan=False))))))
def test_the_pair_keys_loop_in_c_writes_the_bytes_of_the_python(keys):
    # a base's keys go through pair_keys (snapshots/_written.c), which packs ints itself: every
    # MessagePack int width and both ends of 64 bits, against the reference loop
    made = {"c": 0, "py": 0}

    def starts_of(side):
        starts: dict = {}

        def start_of(s):
            made[side] += 1
            starts[s] = (b"G" + s[:1].encode("utf-8", "surrogatepass"), pair_start(s))
            return starts[s]
        return starts, start_of

    other = lambda k: b"O" + encode_key(k)  # noqa: E731
    twice = keys + keys
    fast = codec._pair_keys(twice, *starts_of("c"), other, codec._tail_of, codec._TUPLE_HEADS)
    assert fast == codec._encode_pairs(twice, *starts_of("py"), other)
    assert made["c"] == made["py"]  # the same starts asked for: one per str, the cache's


def _has_nan(x) -> bool:
    if type(x) is float:
        return math.isnan(x)
    return type(x) in (tuple, frozenset) and any(_has_nan(y) for y in x)


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -1, 127, 128, -128, -129, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
        10**100, -(10**100), 0.0, -0.0, 1.5, float("inf"), float("-inf"), "", "héllo ✓", "\ud800", b"", b"\x00\xff",
        [], (), {}, set(), frozenset(), [1], (1,), [1, 2], (1, 2), [True, 1], [1, True], [1, 2.0], [2**63, 1], [1, -(2**63) - 1],
        [-128, 127], [-129, 0], [2**31, 0], [-(2**63), 2**63 - 1], {1: [1, 2], (1, "a"): {"x": None}, frozenset({1}): b""},
        {"z": 1, "a": 2}, [[[]]], ({1, 2}, frozenset({(1, 2)})),
    ],
)
def test_round_trip_examples(value):
    assert same(decode(encode(value)), value)


def test_nan_round_trips():
    assert math.isnan(decode(encode(float("nan"))))


def test_dicts_keep_insertion_order():
    # Observable by user code that iterates its state: a restored state must iterate like the original.
    d = {"z": 1, "a": 2, 3: 3}
    assert list(decode(encode(d))) == ["z", "a", 3]


def test_bool_and_int_stay_apart_in_values():
    assert [type(x) for x in decode(encode([1, True, 0, False]))] == [int, bool, int, bool]
    assert encode(1) != encode(True) and encode(0.0) != encode(-0.0)


# -- determinism ------------------------------------------------------------------------------


@given(st.sets(hashables, max_size=8))
def test_set_bytes_do_not_depend_on_insertion_order(s):
    items = list(s)
    assert encode(set(reversed(items))) == encode(s) == encode(set(items))
    assert encode(frozenset(items)) == encode(frozenset(reversed(items)))


def test_same_bytes_in_processes_with_different_str_hash_seeds():
    code = (
        "import sys; from driftstream.snapshots.codec import encode; "
        "v = {'k': {'apple', 'pear', 'fig', 'kiwi', ('a', 1)}, 'f': frozenset({'x', 'y', 'z'})}; "
        "sys.stdout.write(encode(v).hex())"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert len(outputs) == 1


# -- keys -----------------------------------------------------------------------------------------


def test_equal_keys_share_one_encoding():
    assert encode_key(1) == encode_key(1.0) == encode_key(True)
    assert encode_key(0) == encode_key(0.0) == encode_key(-0.0) == encode_key(False)
    assert encode_key(("a", 1.0, (True,))) == encode_key(("a", 1, (1,)))
    assert encode_key(frozenset({1.0, 2})) == encode_key(frozenset({1, 2}))
    assert encode_key(1.5) != encode_key(1) and encode_key("1") != encode_key(1)
    assert encode_key(2.0**70) == encode_key(2**70)


@pytest.mark.parametrize("key", [[1], {"a": 1}, {1}, ("a", [1])])
def test_unhashable_keys_are_refused_like_a_dict_would(key):
    with pytest.raises(TypeError, match="unhashable"):
        encode_key(key)


# -- refusals ---------------------------------------------------------------------------------------


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    "value, name",
    [(object(), "object"), (Point(1, 2), "Point"), (defaultdict(int), "defaultdict"),
     ([1, {"a": (2, 1j)}], "complex"), ({frozenset({print})}, "builtin_function_or_method")],
)
def test_unsupported_types_raise_a_type_error_that_names_them(value, name):
    with pytest.raises(TypeError) as info:
        encode(value)
    message = str(info.value)
    assert f"type {name}:" in message
    assert "supported types are None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset" in message


# -- hostile input -------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_to_a_value_or_a_decode_error(data):
    try:
        decode(b"\x02" + data)
    except DecodeError:
        pass


@settings(max_examples=100, deadline=None)
@given(values, st.data())
def test_truncated_or_extended_encodings_are_rejected(value, data):
    raw = encode(value)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        decode(raw + b"N")


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01\xc0", b"\x02\xc1", b"\x02\x93\x01", b"\x02\xdd\xff\xff\xff\xff", b"\x02\x81\x91\x01\x01",
     b"\x02\xd4\x02\x91", b"\x02\xd4\x09\x00", b"\x02\xd4\x01\x01", b"\x02\xa1\xff"],
    ids=["empty", "version", "reserved-byte", "truncated", "forged-count", "unhashable-key", "unhashable-set-item",
         "unknown-extension", "tuple-of-non-array", "bad-utf8"],
)
def test_malformed_inputs(data):
    with pytest.raises(DecodeError):
        decode(data)


def test_binary_buffers_are_written_as_bytes():
    # MessagePack has one binary type; a mutable buffer in a state comes back immutable.
    assert decode(encode([bytearray(b"ab"), memoryview(b"cd")])) == [b"ab", b"cd"]


def test_decode_accepts_bytes_like():
    assert decode(memoryview(encode([1, "a"]))) == [1, "a"]
    assert decode(bytearray(encode((1, 2)))) == (1, 2)


# -- nesting ----------------------------------------------------------------------------------------------


def test_tuples_and_sets_nest_inside_each_other():
    value = {(1, (2, frozenset({(3, 4), (5,)}))): [{(6,)}, (7, [8, (9,)])]}
    assert same(decode(encode(value)), value)
