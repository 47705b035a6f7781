"""A KafkaSink's records (value, Meta header) from a bundle's elements: the C
(``_record_batch.c``) gives the Python's bytes for any payload and Meta, and an element
that cannot be encoded fails naming the sink and the element, as in Python."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driftstream.barriers.json_payloads import json_bytes
from driftstream.engine.connectors.kafka import record_batch
from driftstream.engine.connectors.kafka.sink import python_sink_records, sink_records
from driftstream.ordering.meta import Meta

native = pytest.mark.skipif(record_batch.NATIVE is None, reason="the C records are not built (tests/ordering/test_in_order_path.py says why)")

ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**70), 2**70), st.booleans())
metas = st.one_of(
    st.tuples(st.one_of(ints, st.floats(allow_nan=False, allow_infinity=False)), ints, ints, ints, st.lists(ints, max_size=10).map(tuple), st.booleans()),
    st.builds(Meta, st.integers(0, 2**45), st.integers(0, 3), st.integers(0, 3), st.integers(0, 2**40),
              st.lists(st.integers(0, 500), max_size=3).map(tuple), st.booleans()),
    st.tuples(ints, ints, ints, ints),  # a global time alone
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=4)),
    max_leaves=12,
)


@native
@settings(max_examples=300, deadline=None)
@given(elements=st.lists(st.tuples(metas, json_values), max_size=20))
def test_the_c_records_are_the_pythons(elements):
    assert sink_records(elements) == list(python_sink_records(elements))
    assert sink_records(elements, encode=lambda p: repr(p).encode()) == list(python_sink_records(elements, encode=lambda p: repr(p).encode()))


def test_the_index_records_encode_as_compact_json_with_the_meta_header():
    got = sink_records([(Meta(1_700_000_000_000, 0, 1, 5, (3, 1)), {"op": "add", "word": "été", "page_id": 7, "positions": [0, 4], "df": 2})])
    assert got == [('{"op":"add","word":"été","page_id":7,"positions":[0,4],"df":2}'.encode(), [("driftstream-t", b"[1700000000000,0,1,5,[3,1],false]")])]


@pytest.mark.parametrize("payload, why", [([math.nan], "Out of range float"), ({"raw": object()}, "not JSON serializable")])
def test_an_element_that_cannot_be_encoded_fails_naming_the_sink_and_the_element(payload, why):
    elements = [((1, 0, 0, 1, (), False), {"fine": 1}), ((2, 0, 0, 2, (), False), payload)]
    with pytest.raises(TypeError, match=rf"sink 'out' cannot encode .* at t=\(2, 0, 0, 2, \(\), False\): .*{why}"):
        sink_records(elements, json_bytes, "out")


def test_a_user_encoder_that_raises_fails_naming_the_element():
    def encode(p):
        if p == "bad":
            raise ValueError("no")
        return p.encode()

    assert sink_records([((1, 0, 0, 1, (), False), "ok")], encode, "out") == [(b"ok", [("driftstream-t", b"[1,0,0,1,[],false]")])]
    with pytest.raises(TypeError, match=r"sink 'out' cannot encode 'bad' at t=.*: no"):
        sink_records([((1, 0, 0, 1, (), False), "bad")], encode, "out")


def test_elements_from_a_generator_are_all_encoded_and_a_bad_one_still_named():
    """The C takes lists only: it consumes what it reads, and a generator it failed on would
    leave the Python nothing to raise the element's error from."""
    elements = [((1, 0, 0, 1, (), False), {"fine": 1}), ((2, 0, 0, 2, (), False), {"raw": object()})]
    assert sink_records(iter(elements[:1])) == sink_records(elements[:1])
    with pytest.raises(TypeError, match=r"sink 'out' cannot encode .* at t=\(2, 0, 0, 2"):
        sink_records(iter(elements), json_bytes, "out")
