"""The state codec's cost on the shape of a large settled state (figures, not asserts on time).

A snapshot encodes every state changed since the previous one, so on the
inverted index a frequent word's posting list (``{page_id: positions}``, pages
in the thousands) is encoded at every snapshot interval.
"""

from __future__ import annotations

from driftstream.snapshots.codec import decode, encode

POSTINGS = {(1 << 40) + i: list(range(i % 7, i % 7 + 5)) for i in range(1000)}


def test_encode_a_thousand_entry_posting_list(benchmark):
    data = benchmark(encode, POSTINGS)
    assert decode(data) == POSTINGS


def test_decode_a_thousand_entry_posting_list(benchmark):
    data = encode(POSTINGS)
    assert benchmark(decode, data) == POSTINGS
