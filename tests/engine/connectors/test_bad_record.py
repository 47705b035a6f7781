"""BadRecord: a record a source could not decode, as its dead letter holds it."""

from __future__ import annotations

import base64
import json

from driftstream.barriers.json_payloads import json_default
from driftstream.engine.connectors.bad_record import MAX_BYTES, bad_record


def test_utf8_stays_text_and_other_bytes_become_base64():
    text = bad_record("t", 0, 5, 10, b"k", "{été".encode())
    assert (text.key, text.value, text.encoding, text.value_size, text.truncated) == ("k", "{été", "utf-8", 6, False)
    binary = bad_record("t", 0, 6, 10, b"k", b"\x00\xff")
    assert (binary.key, binary.value, binary.encoding) == ("aw==", "AP8=", "base64")
    assert base64.b64decode(binary.value) == b"\x00\xff"


def test_a_null_value_and_a_null_key():
    null = bad_record("t", 1, 7, None, None, None)
    assert (null.key, null.value, null.value_size, null.truncated) == (None, None, -1, False)


def test_a_value_over_the_limit_is_cut_and_says_so():
    big = bad_record("t", 0, 8, 10, None, b"a" * (MAX_BYTES + 10))
    assert big.value == "a" * MAX_BYTES and big.value_size == MAX_BYTES + 10 and big.truncated


def test_it_is_written_as_a_json_object():
    record = bad_record("t", 0, 9, 10, b"k", b"v")
    assert json.loads(json.dumps(record, default=json_default)) == {
        "topic": "t", "partition": 0, "offset": 9, "timestamp": 10, "key": "k", "value": "v", "encoding": "utf-8",
        "value_size": 1, "truncated": False}
