"""Steps over Arrow record batches: ``map_batches`` and ``flat_map_batches``.

The user's function takes the payloads of a batch as one ``pyarrow.RecordBatch`` (a row
per element; the elements are dicts, or JSON documents as bytes parsed into the step's
schema by Arrow's JSON reader, as a ``KafkaSource(value_format="bytes")`` hands out its
records' values) and returns record batches, so parsing, tokenizing
and filtering run in Arrow's C++ kernels instead of once per element in Python. The
engine keeps what makes a run deterministic: an output row of element i sits at i's t
(``flat_map_batches``: at its t with a child id, as a ``flat_map``'s outputs), and a
row's output may depend on that row alone (a replay batches elements differently).

>>> import pyarrow.compute as pc
>>> from driftstream.ordering.meta import Meta
>>> items = [(Meta(0, 0, 0, 0), {"text": "a b"}, None), (Meta(1, 0, 0, 1), {"text": "c"}, None)]
>>> upper = MapBatches("upper", lambda b: b.set_column(0, "text", pc.utf8_upper(b["text"])))
>>> [(m[3], row) for m, row, _ in upper.run(items)]
[(0, {'text': 'A B'}), (1, {'text': 'C'})]
>>> def words(b):
...     split = pc.split_pattern(b["text"], " ")
...     return pa.record_batch({"word": pc.list_flatten(split)}), pc.list_parent_indices(split)
>>> import pyarrow as pa
>>> [(m[3], m[4], row["word"]) for m, row, _ in FlatMapBatches("words", words).run(items)]
[(0, (0,), 'a'), (0, (1,), 'b'), (1, (0,), 'c')]

A batch the function raises on (or answers in the wrong shape) is run again a row at a
time: the failing element is the one named in the ``StepError``, or with
``on_error="dead-letter"`` the one that leaves as a dead letter while the others go on.

Costs: per batch, building the record batch from the payloads (``from_pylist``, ~1 us a
row of a few fields; JSON bytes: one call of Arrow's reader) and the output rows
(``to_pylist``), plus the function's kernels; per output row, a tuple.
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.engine.runtime.operators import FlatMap, Stateless, step_error
from driftstream.ordering.meta import child_of


#: What a JSON document may come as: a record's value
RAW = (bytes, bytearray, memoryview)


def _record_batch(payloads: list, schema: Any = None) -> Any:
    """The payloads as a record batch of a row each: dicts, or with ``schema`` also JSON
    documents as bytes (:func:`_parsed`)."""
    import pyarrow as pa  # here: most stage processes never run a batch step

    if schema is not None and payloads and isinstance(payloads[0], RAW):
        return _parsed(payloads, schema)
    for payload in payloads:
        if not isinstance(payload, dict):
            also = " (or JSON documents as bytes, given the step's schema=)" if schema is None and isinstance(payload, RAW) else ""
            raise TypeError(f"a batch step takes elements that are dicts{also}, got {type(payload).__name__}")
    return pa.RecordBatch.from_pylist(payloads, schema=schema)


def _parsed(documents: list, schema: Any) -> Any:
    """JSON documents (bytes) as a record batch of ``schema``, a row each, parsed by Arrow's
    JSON reader in one call: fields outside the schema are ignored, a field the schema says
    is not nullable must be there. ValueError (Arrow's ``ArrowInvalid`` is one) if any
    document does not parse into the schema (the step then runs the elements one by one,
    to find which). O(bytes), in C++.

    >>> import pyarrow as pa
    >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("text", pa.string())])
    >>> _parsed([b'{"id": 1, "text": "a", "x": 0}', b'{\\n "id": 2\\n}'], schema).to_pylist()
    [{'id': 1, 'text': 'a'}, {'id': 2, 'text': None}]
    >>> _parsed([b'{"text": "no id"}'], schema)
    Traceback (most recent call last):
    pyarrow.lib.ArrowInvalid: JSON parse error: a required field was absent
    """
    import pyarrow as pa
    import pyarrow.json as pj

    if any(type(d) is not bytes for d in documents):
        if not all(isinstance(d, RAW) for d in documents):
            raise TypeError("a batch of JSON documents holds something else than bytes")
        documents = [bytes(d) for d in documents]
    # A raw newline in a JSON document can only be whitespace: one document a line.
    data = b"\n".join(d.replace(b"\n", b" ").replace(b"\r", b" ") if b"\n" in d or b"\r" in d else d for d in documents)
    table = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
                         parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    if table.num_rows != len(documents):
        raise ValueError(f"{len(documents)} document(s) gave {table.num_rows} row(s): each must be one JSON object")
    return table.select(schema.names).combine_chunks().to_batches()[0]


class BatchShapeError(TypeError):
    """The function answered a batch in a shape the step cannot take: a bug of the function,
    not of an element, so the batch is not run again row by row (it fails the run)."""


def _rows(result: Any) -> list:
    """A returned record batch (or table) as a list of dicts."""
    import pyarrow as pa

    if not isinstance(result, (pa.RecordBatch, pa.Table)):
        raise BatchShapeError(f"the function must return a pyarrow.RecordBatch (or Table), got {type(result).__name__}")
    return result.to_pylist()


class _Batched(Stateless):
    """A stateless step run a batch at a time; :meth:`one` is the same for one element."""

    __slots__ = ("schema",)
    batched = True

    def __init__(self, name: str, fn: Any, schema: Any = None) -> None:
        super().__init__(name, fn)
        self.schema = schema  # of the rows: JSON bytes are parsed with it (see _record_batch)

    def run(self, items: list) -> list:
        out = self.run_batch(items)
        if out is not None:
            return out
        out = []
        for item in items:
            try:
                out += self.one(item)
            except Exception as exc:
                raise step_error(self.name, item[0], item[1], exc) from exc
        return out

    def run_batch(self, items: list) -> Optional[list]:
        """The outputs of ``items`` from one call of the function, or None if it raised
        (the caller then looks for the failing element one by one). An answer of the wrong
        shape raises a StepError at the batch's first element."""
        if not items:
            return []
        try:
            return self._outputs(items)
        except BatchShapeError as exc:
            raise step_error(self.name, items[0][0], items[0][1], exc) from exc
        except Exception:
            return None

    def one(self, item: tuple) -> list:
        return self._outputs([item])

    def _outputs(self, items: list) -> list:
        raise NotImplementedError


class MapBatches(_Batched):
    """``fn(record batch) -> record batch`` of as many rows: row i is element i's output."""

    __slots__ = ()

    def _outputs(self, items: list) -> list:
        rows = _rows(self.fn(_record_batch([p for _, p, _ in items], self.schema)))
        if len(rows) != len(items):
            raise BatchShapeError(f"map_batches: the function returned {len(rows)} rows for {len(items)}: "
                             "it must return a row per row (flat_map_batches returns any number)")
        return [(item[0], row, None) for item, row in zip(items, rows)]


class FlatMapBatches(_Batched):
    """``fn(record batch) -> (record batch, parents)``: output row j comes from input row
    ``parents[j]`` (``pyarrow.compute.list_parent_indices`` of a split gives them); an
    element's outputs take child ids 0, 1, ... in the order they were returned."""

    __slots__ = ()

    def _outputs(self, items: list) -> list:
        result = self.fn(_record_batch([p for _, p, _ in items], self.schema))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise BatchShapeError("flat_map_batches: the function must return (record batch, parents): "
                            "parents[j] is the input row output row j comes from")
        rows, parents = _rows(result[0]), result[1]
        parents = [int(p) for p in (parents.to_pylist() if hasattr(parents, "to_pylist") else parents)]
        if len(parents) != len(rows):
            raise BatchShapeError(f"flat_map_batches: {len(rows)} rows but {len(parents)} parents")
        if any(p < 0 or p >= len(items) for p in parents):
            raise BatchShapeError(f"flat_map_batches: a parent outside the batch's rows 0..{len(items) - 1}")
        order = sorted(range(len(rows)), key=parents.__getitem__)  # stable: each element's outputs in their order
        out, last, k = [], -1, 0
        for j in order:
            p = parents[j]
            k = k + 1 if p == last else 0
            last = p
            out.append((child_of(items[p][0], k), rows[j], None))
        return out

    letter = FlatMap.letter  # a dead letter at its element's first child's t
