"""The workload's records: input documents, tokens, and the index's change records.

Input (JSON in the input topic)::

    {"page_id": int, "title": str, "text": str, "sent_at_ms": float}

Change records (JSON in the output topic), one per (word, page) change::

    {"op": "add", "word": str, "page_id": int, "positions": [int], "df": int}
    {"op": "remove", "word": str, "page_id": int, "df": int}

``df`` is the number of pages holding the word after the change, so the sequence
of ``df`` values depends on the order in which documents are applied.

>>> tokenize("The cat saw the Cat.")
['the', 'cat', 'saw', 'the', 'cat']
>>> word_positions("The cat saw the Cat.")
{'the': [0, 3], 'cat': [1, 4], 'saw': [2]}

A page sent again with changed text yields removes for the words that left it,
then adds for the words that are new or whose positions changed:

>>> page_changes({"a": [0], "b": [1]}, {"b": [0], "c": [1]})
[('remove', 'a', None), ('add', 'b', [0]), ('add', 'c', [1])]
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """The lower-cased ``\\w+`` matches of ``text``, in order."""
    return [w.lower() for w in WORD.findall(text)]


def word_positions(text: str) -> dict[str, list[int]]:
    """Each distinct word of ``text`` with its token indexes, words in order of first occurrence."""
    positions: dict[str, list[int]] = {}
    for i, word in enumerate(tokenize(text)):
        positions.setdefault(word, []).append(i)
    return positions


def page_changes(old: Optional[dict[str, list[int]]], new: dict[str, list[int]]) -> list[tuple]:
    """``(op, word, positions)`` turning a page's previous words ``old`` into ``new``.

    Removes come first (in ``old``'s order), then adds (in ``new``'s order); a word
    whose positions did not change yields nothing. ``old`` is None for a new page.
    """
    old = old or {}
    removes = [("remove", w, None) for w in old if w not in new]
    adds = [("add", w, p) for w, p in new.items() if old.get(w) != p]
    return removes + adds


_PAGE = b'"page_id":'


def page_of_line(line: bytes) -> int:
    """The ``page_id`` of a change record's JSON line (as a file sink wrote it), without decoding
    the rest. O(1). A driver that follows a job's output decodes its records after the run:
    decoding them as they came would take the driver's CPU from the job under test (490k
    records: 2.7 s of ``json.loads``), as driftstream's measuring consumer decodes only after.

    >>> page_of_line(b'{"op":"add","word":"a","page_id":-17,"df":1}'), page_of_line(b'{"page_id": 5}')
    (-17, 5)
    """
    start = line.index(_PAGE) + len(_PAGE)
    while line[start] == 32:  # a space after the colon
        start += 1
    end = start
    while line[end] in b"-0123456789":
        end += 1
    return int(line[start:end])


def rebuild_index(records: Iterable[dict]) -> dict[str, dict[int, list[int]]]:
    """The index ``{word: {page_id: positions}}`` that a sequence of change records describes.

    >>> rebuild_index([{"op": "add", "word": "a", "page_id": 1, "positions": [0], "df": 1},
    ...                {"op": "remove", "word": "a", "page_id": 1, "df": 0}])
    {}
    """
    index: dict[str, dict[int, list[int]]] = {}
    for r in records:
        pages = index.setdefault(r["word"], {})
        if r["op"] == "add":
            pages[r["page_id"]] = list(r["positions"])
        else:
            pages.pop(r["page_id"], None)
            if not pages:
                del index[r["word"]]
    return index
