"""A step's dead letter stays writable: an element (or error text, or traceback) over 64 KiB
is kept cut, the letter saying so and how big the element was, as a source's letters are
(a letter over a Kafka topic's max.message.bytes failed the run after the sink's 60 s)."""

from __future__ import annotations

import pytest

from driftstream.barriers.json_payloads import json_bytes
from driftstream.engine import Flow
from driftstream.engine.connectors.bad_record import bad_record
from driftstream.engine.model.errors import LETTER_MAX_BYTES, DeadLetter, dead_letter
from driftstream.engine.testing import MemorySink, MemorySource

MIB = 1024 * 1024
META = (1, 0, 0, 7, ())


def letter_of(element, fail=lambda x: int("not a number")) -> DeadLetter:
    try:
        fail(element)
    except Exception as exc:
        return dead_letter("parse", META, element, exc)
    raise AssertionError("did not fail")


def test_a_letter_that_fits_is_kept_whole():
    letter = letter_of({"id": 3, "text": "x" * 1000})
    assert letter.element == {"id": 3, "text": "x" * 1000} and not letter.truncated and letter.element_size is None
    assert letter == DeadLetter("parse", letter.element, META, letter.error, letter.traceback)  # as before


@pytest.mark.parametrize("element, kept_type, size", [
    ("é" * MIB, str, 2 * MIB),                        # 2 MiB of UTF-8
    (b"\xff" * (2 * MIB), bytes, 2 * MIB),             # not UTF-8: base64 in JSON
    ({"doc": "x" * (2 * MIB)}, str, 2 * MIB + 10),     # its JSON: {"doc":"..."}
    (["x" * 100] * 30_000, str, 103 * 30_000 + 1),     # its JSON, not its length
], ids=["text", "bytes", "dict", "list"])
def test_a_2_mib_element_is_cut_to_64_kib_saying_so_and_its_size(element, kept_type, size):
    letter = letter_of(element)
    assert letter.truncated and letter.element_size == size
    assert type(letter.element) is kept_type
    kept = letter.element.encode() if kept_type is str else letter.element
    assert LETTER_MAX_BYTES - 3 <= len(kept) <= LETTER_MAX_BYTES  # a UTF-8 character is not split
    whole = element.encode() if isinstance(element, str) else element if isinstance(element, bytes) else json_bytes(element)
    assert kept == whole[: len(kept)]  # its beginning
    assert len(json_bytes(letter)) < 200 * 1024  # far below a topic's 1 MiB
    assert letter.error.startswith("ValueError: invalid literal")


def test_an_error_that_holds_the_element_is_cut_too():
    def fail(x):
        raise ValueError(f"bad document {x}")

    letter = letter_of("small", fail)
    assert not letter.truncated
    big = "y" * (2 * MIB)
    letter = letter_of(big, fail)
    assert letter.truncated and letter.element_size == 2 * MIB
    assert letter.error.startswith("ValueError: bad document yyy") and len(letter.error) == LETTER_MAX_BYTES
    assert letter.traceback.startswith("Traceback") and len(letter.traceback) <= LETTER_MAX_BYTES
    assert len(json_bytes(letter)) < 4 * LETTER_MAX_BYTES


def test_a_source_letter_is_left_as_its_source_cut_it():
    record = bad_record("orders", 3, 1207, None, b"k", b"\xff" * (2 * MIB))  # cut by bad_record: 64 KiB, base64
    letter = letter_of(record)
    assert letter.element is record and not letter.truncated


def test_a_step_failing_on_a_2_mib_element_sends_a_cut_letter_and_goes_on():
    flow = Flow("big").dead_letters(MemorySink("dlq"))
    flow.source(MemorySource(["1", "x" * (2 * MIB), "3"]), name="src").map(int, on_error="dead-letter").sink(MemorySink("out"))
    result = flow.run(runtime="simulator")
    assert result.output("out") == [1, 3]
    [letter] = result.output("dlq")
    assert letter.step == "map" and letter.truncated and letter.element_size == 2 * MIB
    assert letter.element == "x" * LETTER_MAX_BYTES and len(letter.error) <= LETTER_MAX_BYTES
