"""The documents' words in Arrow: :func:`document_words_batch` is :func:`.pipeline.document_words`
for a batch of documents at once, as ``flat_map_batches`` takes it (``build(words="arrow")``).

A document's words are the lower-cased runs of word characters (Python's ``\\w``: letters,
digits and ``_``), each distinct word with its token indexes, in order of first occurrence.
Here the split, lower-casing and grouping run in Arrow's C++ kernels; only the rows
out become Python dicts. Lower-casing is Unicode's in both, but for Python's final sigma
(an upper-case word's last "Σ" becomes "ς", Arrow's "σ"), which the corpus does not have.

>>> import pyarrow as pa
>>> rows, parents = document_words_batch(pa.RecordBatch.from_pylist([
...     {"page_id": 7, "text": "To be, or not to be"}, {"page_id": 8, "text": "Éte"}]))
>>> [(r["word"], r["page_id"], r["positions"]) for r in rows.to_pylist()], parents.to_pylist()
([('to', 7, [0, 4]), ('be', 7, [1, 5]), ('or', 7, [2]), ('not', 7, [3]), ('éte', 8, [0])], [0, 0, 0, 0, 1])

(``parents``: the document row of each word row; the elements are ``{"op": "add", ...}``.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: A document's row: what :func:`.pipeline._document` checks, as the schema Arrow parses JSON documents into.
DOCUMENT = pa.schema([pa.field("page_id", pa.int64(), nullable=False), pa.field("text", pa.string(), nullable=False)])
#: What separates words: anything but Python's ``\\w`` (RE2's ``\\w`` is ASCII only).
NOT_WORD = r"[^\p{L}\p{N}_]+"


def document_words_batch(batch: pa.RecordBatch) -> tuple:
    """``(record batch of {op, word, page_id, positions}, parents)`` for documents ``{page_id, text}``."""
    split = pc.split_pattern_regex(batch["text"], NOT_WORD)
    tokens, doc = pc.list_flatten(split), pc.list_parent_indices(split)
    keep = pc.not_equal(tokens, "")  # the split's empty ends (a text that starts or ends with a separator)
    tokens, doc = pc.filter(tokens, keep), pc.filter(doc, keep)
    # Python lower-cases "İ" to "i" and a combining dot; Arrow to "i" (4 documents of the 26,210)
    tokens = pc.utf8_lower(pc.replace_substring(tokens, "İ", "i\u0307"))
    # A token's index in its document: its index overall less its document's first token's
    # (``doc`` is sorted, so that is where a binary search for its document lands).
    doc_numbers = doc.to_numpy()
    index = np.arange(len(doc_numbers), dtype=np.int64)
    position = index - np.searchsorted(doc_numbers, doc_numbers, side="left")
    grouped = (pa.table({"doc": doc, "word": tokens, "position": position, "first": index})
               .group_by(["doc", "word"], use_threads=False)
               .aggregate([("position", "list"), ("first", "min")]))
    grouped = grouped.sort_by([("doc", "ascending"), ("first_min", "ascending")])  # words in order of first occurrence
    parents = grouped["doc"].combine_chunks()
    rows = pa.record_batch({
        "op": pa.array(["add"] * grouped.num_rows),
        "word": grouped["word"].combine_chunks(),
        "page_id": pc.take(batch["page_id"], parents),
        "positions": grouped["position_list"].combine_chunks(),
    })
    return rows, parents
