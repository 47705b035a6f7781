"""The inverted index on driftstream: documents in, index change records out.

Edit-free (every page is sent once)::

    documents --flat_map--> (word, page_id, positions) per distinct word
              --key_by word--> stateful_flat_map index --> change records

With edits (a page may be sent again with changed text), a page-keyed stage in
front keeps each page's previous words and turns a new version into removes and
adds (:func:`~driftstream.examples.inverted_index.documents.page_changes`)::

    documents --key_by page_id--> stateful_flat_map page_words
              --key_by word--> stateful_flat_map index --> change records

The index's state for a word is its posting list, ``page_id -> positions``, held as
entries (``MapState``): a change costs O(1) however many pages hold the word. ``df``
in each change record is the number of pages holding the word after the change, so
the output depends on the order of documents, and is the same in every run.

>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> docs = [{"page_id": 1, "text": "a b a"}, {"page_id": 2, "text": "b c"}]
>>> result = build(MemorySource(docs), MemorySink("changes")).run(runtime="simulator", seed=3)
>>> [(r["word"], r["page_id"], r["df"]) for r in result.output("changes")]
[('a', 1, 1), ('b', 1, 1), ('b', 2, 2), ('c', 2, 1)]
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.engine.model.connectors import Sink, Source
from driftstream.engine import Flow, MapState

from .documents import page_changes, word_positions


def document_words(doc: dict) -> list[tuple]:
    """One ``("add", word, page_id, positions)`` per distinct word of a new page.

    >>> document_words({"page_id": 7, "text": "To be or not to be"})[:2]
    [('add', 'to', 7, [0, 4]), ('add', 'be', 7, [1, 5])]
    """
    page_id = doc["page_id"]
    return [("add", w, page_id, p) for w, p in word_positions(doc["text"]).items()]


def page_words(previous: Optional[dict], doc: dict) -> tuple:
    """State: the page's words ``{word: positions}``; emits the changes a new version makes.

    >>> state, out = page_words(None, {"page_id": 7, "text": "a b"})
    >>> page_words(state, {"page_id": 7, "text": "b c"})[1]
    [('remove', 'a', 7, None), ('add', 'b', 7, [0]), ('add', 'c', 7, [1])]
    """
    current = word_positions(doc["text"])
    page_id = doc["page_id"]
    return current, [(op, w, page_id, p) for op, w, p in page_changes(previous, current)]


def index_update(postings: MapState, change: tuple) -> list:
    """State: the word's posting list, page_id -> positions, as entries; emits the change
    record with ``df``, the number of pages holding the word after the change.

    O(1) whatever the number of pages holding the word: one entry written or removed
    (run with ``state=MapState``; a late arrival undoes and redoes just that entry).
    """
    op, word, page_id, positions = change
    if op == "add":
        postings.put(page_id, positions)
        return [{"op": "add", "word": word, "page_id": page_id, "positions": positions, "df": len(postings)}]
    postings.remove(page_id)
    return [{"op": "remove", "word": word, "page_id": page_id, "df": len(postings)}]


def index_update_copying(postings: Optional[dict], change: tuple) -> tuple:
    """The same index with the whole posting list as the state value: each change copies
    the dict (the engine may apply a change again to the same state after a late
    arrival), O(pages holding the word). Kept to measure what entry state saves
    (``driftstream bench backlog --state value``).

    >>> state, out = index_update_copying(None, ("add", "a", 7, [0, 2]))
    >>> out
    [{'op': 'add', 'word': 'a', 'page_id': 7, 'positions': [0, 2], 'df': 1}]
    >>> index_update_copying(state, ("remove", "a", 7, None))[1]
    [{'op': 'remove', 'word': 'a', 'page_id': 7, 'df': 0}]
    """
    op, word, page_id, positions = change
    new = dict(postings) if postings else {}
    if op == "add":
        new[page_id] = positions
        return new, [{"op": "add", "word": word, "page_id": page_id, "positions": positions, "df": len(new)}]
    new.pop(page_id, None)
    return new, [{"op": "remove", "word": word, "page_id": page_id, "df": len(new)}]


def build(source: Source, sink: Sink, name: str = "inverted_index", edits: bool = False, state: str = "entries",
          words: str = "python", bad_documents: str = "fail") -> Flow:
    """The index flow from ``source`` (documents as dicts) to ``sink`` (change records).

    ``state``: ``"entries"`` (:func:`index_update`, the posting list as MapState entries) or
    ``"value"`` (:func:`index_update_copying`, the posting list a dict copied per change).
    ``words``: ``"python"`` (:func:`document_words` per document) or ``"arrow"`` (a batch of
    documents at a time, :func:`.arrow_words.document_words_batch`, from dicts or JSON bytes;
    without ``edits``; ``bad_documents``: its ``on_error``)."""
    if words not in ("python", "arrow") or (words == "arrow" and edits):
        raise ValueError(f"words is 'python' or 'arrow' (without edits), not {words!r}")
    f = Flow(name)
    docs = f.source(source, name="documents")
    if edits:
        changes = docs.key_by(_page_id, name="by_page").stateful_flat_map(page_words, name="page_words")
    elif words == "arrow":
        from .arrow_words import DOCUMENT, document_words_batch

        # Documents as dicts, or as the JSON bytes a KafkaSource(value_format="bytes") hands
        # out, parsed by Arrow; one that does not fit DOCUMENT fails the run, or with
        # bad_documents="dead-letter" becomes a dead letter
        changes = (docs.flat_map_batches(document_words_batch, name="words", schema=DOCUMENT, on_error=bad_documents)
                   .map(_as_change, name="as_change"))
    else:
        changes = docs.flat_map(document_words, name="words")
    by_word = changes.key_by(_word, name="by_word")
    if state == "entries":
        index = by_word.stateful_flat_map(index_update, name="index", state=MapState)
    elif state == "value":
        index = by_word.stateful_flat_map(index_update_copying, name="index")
    else:
        raise ValueError(f"state is 'entries' or 'value', not {state!r}")
    index.sink(sink)
    return f


def kafka_flow(
    bootstrap_servers: str, input_topic: str, output_topic: str, name: str = "inverted_index", edits: bool = False, state: str = "entries",
    words: str = "python",
) -> Flow:
    """The index flow between two Kafka topics; malformed documents go to ``<input_topic>.dlq``.
    With ``words="arrow"`` the source hands out the records' bytes and Arrow parses them a
    batch at a time."""
    from driftstream.engine import KafkaSink, KafkaSource

    source = KafkaSource(input_topic, bootstrap_servers, value_format="bytes" if words == "arrow" else _document)
    return build(source, KafkaSink(output_topic, bootstrap_servers), name=name, edits=edits, state=state, words=words,
                 bad_documents="dead-letter")


def _as_change(row: dict) -> tuple:
    """A word row of :func:`.arrow_words.document_words_batch` as :func:`document_words` gives it."""
    return row["op"], row["word"], row["page_id"], row["positions"]


def _document(raw: bytes) -> Any:
    """Decode and check one input record (a failure sends it to the dead-letter topic)."""
    import json

    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("page_id"), int) or not isinstance(doc.get("text"), str):
        raise ValueError('a document must be a JSON object with an int "page_id" and a str "text"')
    return doc


def _page_id(doc: dict) -> int:
    return doc["page_id"]


def _word(change: tuple) -> str:
    return change[1]
