"""map_batches and flat_map_batches: the outputs, Metas and errors of the per-element steps,
however the elements are cut into batches; a failing element is found and named."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow
from driftstream.engine.model.errors import DeadLetter, StepError
from driftstream.engine.runtime.arrow_operators import FlatMapBatches, MapBatches
from driftstream.engine.runtime.operators import DeadLettering, FlatMap, Map
from driftstream.engine.testing import MemorySink, MemorySource, PacedSource
from driftstream.ordering.meta import Meta
from tests.conftest import flow_actors
from tests.status_wait import kill_after


def words_batch(batch: pa.RecordBatch) -> tuple:
    # Not pc.utf8_split_whitespace: in pyarrow 26.0.1, over a slice of an array (a batch cut
    # out of a longer one, as _in_batches cuts them), it now and then keeps the trailing
    # whitespace of the slice's last string ("aaabb " for "aaabb "; 306 of 1,328,742 random
    # slices in a loop), and the test failed on Arrow's kernel, not on FlatMapBatches.
    split = pc.split_pattern_regex(batch["text"], r"\s+")
    words, parents = pc.list_flatten(split), pc.list_parent_indices(split)
    keep = pc.not_equal(words, "")  # str.split() has no empty words at the ends
    words, parents = pc.filter(words, keep), pc.filter(parents, keep)
    return pa.record_batch({"word": words, "page": pc.take(batch["page"], parents)}), parents


def words_one(doc: dict) -> list:
    return [{"word": w, "page": doc["page"]} for w in doc["text"].split()]


def doubled_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"n": pc.multiply(batch["n"], 2)})


def _items(payloads: list, tombstones: list) -> list:
    return [(Meta(i, 0, 0, i, (), dead), p, None) for i, (p, dead) in enumerate(zip(payloads, tombstones))]


def _in_batches(op, items: list, cuts: list) -> list:
    bounds = sorted({0, len(items), *(c % (len(items) + 1) for c in cuts)})
    return [out for a, b in zip(bounds, bounds[1:]) for out in op.run(items[a:b])]


texts = st.lists(st.text(alphabet="ab ", max_size=8), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(texts=texts, cuts=st.lists(st.integers(0, 40), max_size=5), data=st.data())
def test_flat_map_batches_gives_flat_maps_outputs_and_metas_for_any_batches(texts, cuts, data):
    payloads = [{"text": t, "page": i} for i, t in enumerate(texts)]
    items = _items(payloads, data.draw(st.lists(st.booleans(), min_size=len(texts), max_size=len(texts))))
    assert _in_batches(FlatMapBatches("w", words_batch), items, cuts) == FlatMap("w", words_one).run(items)


@settings(max_examples=50, deadline=None)
@given(ns=st.lists(st.integers(-1000, 1000), min_size=1, max_size=30), cuts=st.lists(st.integers(0, 40), max_size=5))
def test_map_batches_gives_maps_outputs_for_any_batches(ns, cuts):
    items = _items([{"n": n} for n in ns], [False] * len(ns))
    assert _in_batches(MapBatches("d", doubled_batch), items, cuts) == Map("d", lambda x: {"n": 2 * x["n"]}).run(items)


def _fails_on_seven(batch: pa.RecordBatch) -> pa.RecordBatch:
    if 7 in batch["n"].to_pylist():
        raise ValueError("no sevens")
    return doubled_batch(batch)


def test_a_failing_batch_is_run_row_by_row_and_names_its_element():
    calls = []

    def counted(batch):
        calls.append(batch.num_rows)
        return _fails_on_seven(batch)

    items = _items([{"n": n} for n in (1, 7, 3)], [False] * 3)
    with pytest.raises(StepError) as err:
        MapBatches("double", counted).run(items)
    assert err.value.step == "double" and "7" in err.value.element and "no sevens" in str(err.value)
    assert calls == [3, 1, 1]  # the batch, then rows until the failing one

    calls.clear()
    out = DeadLettering(MapBatches("double", counted)).run(items)
    assert [p for _, p, _ in out[::2]] == [{"n": 2}, {"n": 6}]
    assert isinstance(out[1][1], DeadLetter) and out[1][1].step == "double" and out[1][0] == items[1][0]
    calls.clear()
    DeadLettering(MapBatches("double", counted)).run(_items([{"n": 1}, {"n": 2}], [False, False]))
    assert calls == [2]  # no failure: one call for the batch


@pytest.mark.parametrize("fn, message", [
    (lambda b: pa.record_batch({"n": [1]}), "returned 1 rows for 2"),
    (lambda b: [1, 2], "must return a pyarrow.RecordBatch"),
])
def test_map_batches_says_what_a_wrong_answer_is(fn, message):
    with pytest.raises(StepError, match=message) as err:
        MapBatches("shape", fn).run(_items([{"n": 1}, {"n": 2}], [False, False]))
    assert err.value.step == "shape"


def test_flat_map_batches_takes_parents_in_any_order_and_checks_them():
    items = _items([{"text": "a b"}, {"text": "c"}], [False, False])

    def reversed_rows(batch):
        return pa.record_batch({"w": ["c", "b", "a"]}), [1, 0, 0]

    out = FlatMapBatches("r", reversed_rows).run(items)
    assert [(m[3], m[4], p["w"]) for m, p, _ in out] == [(0, (0,), "b"), (0, (1,), "a"), (1, (0,), "c")]
    with pytest.raises(StepError, match="outside the batch"):
        FlatMapBatches("r", lambda b: (pa.record_batch({"w": ["x"]}), [5])).run(items)
    with pytest.raises(StepError, match=r"\(record batch, parents\)"):
        FlatMapBatches("r", lambda b: pa.record_batch({"w": ["x"]})).run(items)


def test_elements_that_are_not_rows_are_named():
    with pytest.raises(StepError, match="takes elements that are dicts") as err:
        MapBatches("rows", doubled_batch).run(_items(["not a dict"], [False]))
    assert "not a dict" in err.value.element


DOC = pa.schema([pa.field("text", pa.string(), nullable=False), pa.field("page", pa.int64(), nullable=False)])


@settings(max_examples=50, deadline=None)
@given(texts=texts, cuts=st.lists(st.integers(0, 40), max_size=5))
def test_json_documents_are_parsed_by_arrow_into_the_schema_as_dicts_are_taken(texts, cuts):
    """Bytes (a KafkaSource's values) and dicts give the same rows however they are cut:
    with a schema, no type depends on the batch's other rows."""
    docs = [{"text": t, "page": i, "extra": [i]} for i, t in enumerate(texts)]
    as_json = _items([json.dumps(d, indent=1 if i % 2 else None).encode() for i, d in enumerate(docs)], [False] * len(docs))
    as_dicts = _items(docs, [False] * len(docs))
    assert _in_batches(FlatMapBatches("w", words_batch, DOC), as_json, cuts) == FlatMap("w", words_one).run(as_dicts)


def test_a_json_document_that_does_not_fit_the_schema_is_a_dead_letter_and_the_others_go_on():
    good = [json.dumps({"text": f"a{i} b", "page": i}).encode() for i in range(4)]
    bad = [b"not json", b'{"text": "no page"}', b'{"text": "x", "page": "seven"}', b'{"text": "two"} {"text": "rows"}']
    flow = Flow("parsed")
    (flow.source(MemorySource(good[:2] + bad + good[2:]), name="docs")
     .flat_map_batches(words_batch, name="words", schema=DOC, on_error="dead-letter").sink(MemorySink("out")))
    flow.dead_letters(MemorySink("dead"))
    result = flow.run(runtime="simulator", seed=1)
    assert [(w["word"], w["page"]) for w in result.output("out")] == [(w, i) for i in range(4) for w in (f"a{i}", "b")]
    letters = result.output("dead")
    assert [d.step for d in letters] == ["words"] * 4 and [d.element for d in letters] == bad
    assert "required field was absent" in letters[1].error and "/page" in letters[2].error


def test_the_dead_letters_of_raw_documents_are_written_by_a_json_sink(tmp_path):
    """A dead letter's element is the record's bytes: a FileSink (or KafkaSink) writes it
    as its text, with its encoding."""
    flow = Flow("parsed-file")
    (flow.source(MemorySource([b'{"text": "a", "page": 1}', b"not json", b"\xff"]), name="docs")
     .flat_map_batches(words_batch, name="words", schema=DOC, on_error="dead-letter").sink(MemorySink("out")))
    flow.dead_letters(FileSink(tmp_path, name="dead"))
    flow.run(runtime="simulator", seed=1)
    letters = [v for _, v in read_file_sink(tmp_path, "dead")]
    assert [d["element"] for d in letters] == [{"encoding": "utf-8", "data": "not json"}, {"encoding": "base64", "data": "/w=="}]


def test_a_schema_must_be_an_arrow_schema_and_bytes_need_one():
    from driftstream.engine.model.errors import FlowError

    with pytest.raises(FlowError, match="schema= takes a pyarrow.Schema"):
        Flow("f").source(MemorySource([])).map_batches(doubled_batch, schema={"n": "int"})
    with pytest.raises(StepError, match="given the step's schema="):
        MapBatches("rows", doubled_batch).run(_items([b'{"n": 1}'], [False]))


def test_a_flow_of_batch_steps_on_the_simulator_equals_the_per_element_flow():
    docs = [{"text": " ".join("w%d" % ((i * j) % 11) for j in range(i % 6)), "page": i} for i in range(200)]

    def build(batched: bool) -> Flow:
        flow = Flow("batches" if batched else "elements")
        src = flow.source(MemorySource(docs, partitions=2), name="docs")
        words = src.flat_map_batches(words_batch, name="words") if batched else src.flat_map(words_one, name="words")
        words.key_by(lambda w: w["word"], name="by_word").stateful_map(_count, name="count").sink(MemorySink("out"))
        return flow

    expected = build(False).run(runtime="simulator", parallelism=2).output("out")
    assert build(True).run(runtime="simulator", parallelism=2, seed=3).output("out") == expected
    assert len(expected) == sum(len(d["text"].split()) for d in docs)


def _count(n, w):
    n = (n or 0) + 1
    return n, [w["word"], w["page"], n]


@pytest.mark.ray
def test_batch_steps_on_ray_exactly_once_through_a_kill(ray_session, tmp_path):
    docs = [{"text": " ".join("w%d" % ((i * j) % 13) for j in range(i % 7)), "page": i} for i in range(3000)]
    name = f"arrow-{uuid.uuid4().hex[:6]}"
    flow = Flow(name)
    (flow.source(PacedSource(docs, rate=1500, partitions=2), name="docs")
     .flat_map_batches(words_batch, name="words").key_by(lambda w: w["word"], name="by_word")
     .stateful_map(_count, name="count").sink(FileSink(tmp_path / "out", name="out")))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    try:
        kill_after(handle, f"{name}/by_word/1", 2_000)
        handle.wait(timeout=120)
    finally:
        if flow_actors(name + "/"):
            handle.stop(timeout=60)
    got = [v for _, v in read_file_sink(tmp_path / "out", "out")]
    # Each word's counts are 1..n, once each (the order of the documents of two partitions in
    # t decides which page gets which count), and every (word, page) is there once.
    per_word: dict = {}
    for word, _, n in got:
        per_word.setdefault(word, []).append(n)
    expected = sorted((w, doc["page"]) for doc in docs for w in doc["text"].split())
    assert sorted((w, page) for w, page, _ in got) == expected
    assert all(sorted(ns) == list(range(1, len(ns) + 1)) for ns in per_word.values())
