"""Record batches encoded in one pass: what kafka-python's reader (the broker's format)
reads back is what was written, with a valid CRC, for any values and headers; the C
batches (``_record_batch.c``) are the Python's bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from driftstream.engine.connectors.kafka import record_batch
from driftstream.engine.connectors.kafka.record_batch import EncodedBatch, encoded_batches, python_batches

native = pytest.mark.skipif(record_batch.NATIVE is None, reason="the C batches are not built (tests/ordering/test_in_order_path.py says why)")

headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=300)), max_size=3)
records = st.lists(st.tuples(st.binary(max_size=2_000), headers), min_size=1, max_size=30)


def read_back(data: bytes) -> list:
    out, batches = [], MemoryRecords(data)
    while batches.has_next():
        batch = batches.next_batch()
        assert batch.validate_crc() and batch.magic == 2 and batch.compression_type == 0
        out += [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    return out


@settings(max_examples=200, deadline=None)
@given(records=records, ts=st.integers(0, 2**41))
def test_every_record_reads_back_as_written(records, ts):
    batch = EncodedBatch.of(records, ts)
    got = read_back(batch.buffer())
    assert batch.next_offset() == len(records)
    assert got == [(i, ts, None, value, [(k, v) for k, v in hs]) for i, (value, hs) in enumerate(records)]


@settings(max_examples=100, deadline=None)
@given(records=records, max_bytes=st.integers(100, 50_000))
def test_batches_split_by_size_keep_every_record_in_order(records, max_bytes):
    batches = list(encoded_batches(records, max_bytes, clock=lambda: 1.5))
    values = [v for b in batches for _, _, _, v, _ in read_back(b.buffer())]
    assert values == [v for v, _ in records]
    assert all(len(b.buffer()) <= max_bytes or b.count == 1 for b in batches)  # only a lone record may exceed it


@native
@settings(max_examples=300, deadline=None)
@given(records=records, max_bytes=st.integers(60, 50_000), ts=st.integers(0, 2**41))
def test_the_c_batches_are_the_pythons_bytes(records, max_bytes, ts):
    c = [(b.buffer(), b.count) for b in encoded_batches(records, max_bytes, clock=lambda: ts / 1000)]
    assert all(type(data) is bytes for data, _ in c)
    assert c == [(b.buffer(), b.count) for b in python_batches(records, max_bytes, int(ts / 1000 * 1000))]  # the clock's ms


@native
def test_the_c_batches_take_any_bytes_like_value_and_refuse_what_the_python_refuses():
    like = [(bytearray(b"ab"), [("h", memoryview(b"v"))]), (b"", [])]
    assert [b.buffer() for b in encoded_batches(like, 1000, clock=lambda: 1.0)] == [b.buffer() for b in python_batches(like, 1000, 1000)]
    many = [(b"v", [(str(i), b"x") for i in range(20)])]  # past the C's 16 headers: the Python encodes it
    assert [b.buffer() for b in encoded_batches(many, 1000, clock=lambda: 1.0)] == [b.buffer() for b in python_batches(many, 1000, 1000)]
    with pytest.raises(TypeError):  # a str value: both refuse it
        list(encoded_batches([("text", [])], 1000))
    with pytest.raises(AttributeError):  # a header name that is not a str: the Python's own error
        list(encoded_batches([(b"v", [(1, b"x")])], 1000))


keyed_records = st.lists(st.tuples(st.binary(max_size=2_000), headers, st.one_of(st.none(), st.binary(max_size=100))), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(records=keyed_records, max_bytes=st.integers(60, 50_000))
def test_a_keyed_record_reads_back_with_its_key_and_the_c_gives_the_pythons_bytes(records, max_bytes):
    """A keyed KafkaSink's ``(value, headers, key)`` records (None: a null key), in C and in Python."""
    got = [b.buffer() for b in encoded_batches(records, max_bytes, clock=lambda: 1.0)]
    assert [(k, v) for data in got for _, _, k, v, _ in read_back(data)] == [(k, v) for v, _, k in records]
    assert got == [b.buffer() for b in python_batches(records, max_bytes, 1000)]
