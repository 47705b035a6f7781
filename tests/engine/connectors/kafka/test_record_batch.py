"""Record batches encoded in one pass: what kafka-python's reader (the broker's format)
reads back is what was written, with a valid CRC, for any values and headers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from driftstream.engine.connectors.kafka.record_batch import EncodedBatch, encoded_batches

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
