"""FileSink on real files: order across bundles, t_last after reopen, a torn trailing
line ignored and cut off (so a partial bundle is still exact), one fsync per bundle,
non-JSON payloads named by sink and t, and read_file_sink's merge in Meta order; the C
lines (``json_lines`` of ``_record_batch.c``) are the Python's bytes."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.json_payloads import ORJSON_OPTIONS, json_bytes
from driftstream.engine.connectors import file_sink
from driftstream.engine.connectors.file_sink import FileSink, json_lines, python_json_lines, read_file_sink
from driftstream.ordering.meta import Meta


def T(ts, *child, tombstone=False, partition=0):
    """A hot-path meta: a plain 6-tuple."""
    return (ts, 0, partition, ts, tuple(child), tombstone)


def bundle(*pairs):
    return Bundle(list(pairs))


def reopened_last(sink, partition=0, partitions=1):
    """t_last() of a fresh open of the partition (closed again)."""
    part = sink.open(partition, partitions)
    try:
        return part.t_last()
    finally:
        part.close()


def lines(path):
    with open(path, "rb") as f:
        return f.read().split(b"\n")


def test_order_is_preserved_across_bundles(tmp_path):
    sink = FileSink(tmp_path, name="out")
    part = sink.open(0, 1)
    part.write(bundle((T(1), "a"), (T(2), {"k": [1, 2]})))
    part.write(bundle((T(3, 0), "c"), (T(3, 1), None)))
    part.write(bundle((T(5), 5.5)))
    part.close()
    raw = lines(tmp_path / "out-0.jsonl")
    assert raw[-1] == b""  # every line, the last included, is complete
    records = [json.loads(line) for line in raw[:-1]]
    assert [r["t"] for r in records] == [
        [1, 0, 0, 1, [], False],
        [2, 0, 0, 2, [], False],
        [3, 0, 0, 3, [0], False],
        [3, 0, 0, 3, [1], False],
        [5, 0, 0, 5, [], False],
    ]
    assert [r["value"] for r in records] == ["a", {"k": [1, 2]}, "c", None, 5.5]
    assert read_file_sink(tmp_path, "out") == [(Meta(*T(1)), "a"), (Meta(*T(2)), {"k": [1, 2]}),
                                               (Meta(*T(3, 0)), "c"), (Meta(*T(3, 1)), None), (Meta(*T(5)), 5.5)]
    assert part.collected() is None


def test_meta_fields_round_trip_including_tombstones(tmp_path):
    part = FileSink(tmp_path, name="out").open(0, 1)
    metas = [Meta(7, 2, 3, 40, (1, 0)), Meta(7, 2, 3, 40, (1, 0), True), Meta(8.5, 1, 0, 41)]
    part.write(Bundle([(m, i) for i, m in enumerate(metas)]))
    part.close()
    got = read_file_sink(tmp_path, "out")
    assert [m for m, _ in got] == metas
    assert all(type(m) is Meta for m, _ in got)


def test_t_last_empty_then_after_writes_and_after_reopen(tmp_path):
    sink = FileSink(tmp_path, name="out")
    part = sink.open(0, 1)
    assert part.t_last() is None
    part.write(bundle((T(1), "a"), (T(2, 3), "b")))
    assert part.t_last() == Meta(2, 0, 0, 2, (3,), False)
    assert type(part.t_last()) is Meta
    part.close()
    again = sink.open(0, 1)
    assert again.t_last() == Meta(2, 0, 0, 2, (3,), False)
    assert type(again.t_last()) is Meta
    again.write(bundle((T(4), "c")))  # continues the file
    again.close()
    assert [v for _, v in read_file_sink(tmp_path, "out")] == ["a", "b", "c"]
    assert reopened_last(sink) == Meta(*T(4))


def test_empty_bundle_is_a_no_op(tmp_path, monkeypatch):
    part = FileSink(tmp_path, name="out").open(0, 1)
    calls = []
    monkeypatch.setattr(os, "fsync", calls.append)
    part.write(Bundle([]))
    part.close()
    assert calls == [] and (tmp_path / "out-0.jsonl").read_bytes() == b""


def test_torn_trailing_line_is_ignored_cut_off_on_reopen_and_writing_continues(tmp_path):
    sink = FileSink(tmp_path, name="out")
    part = sink.open(0, 1)
    part.write(bundle((T(1), "a"), (T(2), "b")))
    part.close()
    path = tmp_path / "out-0.jsonl"
    durable = path.read_bytes()
    # A crash mid-bundle: one more complete line would be fine, but here the next
    # bundle's first line got only halfway to disk.
    torn = b'{"t":[3,0,0,3,[],false],"value":"c"}\n'
    with open(path, "ab") as f:
        f.write(torn[: len(torn) // 2])
    assert [v for _, v in read_file_sink(tmp_path, "out")] == ["a", "b"]  # readers ignore it
    assert path.read_bytes() != durable  # ...without touching the file

    again = sink.open(0, 1)
    assert again.t_last() == Meta(*T(2))
    assert path.read_bytes() == durable  # reopening cut the partial line off
    # The barrier replays from after t_last(): exactly the missing elements.
    replay = bundle((T(1), "a"), (T(2), "b"), (T(3), "c"), (T(4), "d")).after(again.t_last())
    again.write(replay)
    again.close()
    assert [json.loads(line)["value"] for line in lines(path)[:-1]] == ["a", "b", "c", "d"]
    assert reopened_last(sink) == Meta(*T(4))


def test_file_that_is_only_a_partial_line_reopens_empty(tmp_path):
    path = tmp_path / "out-0.jsonl"
    path.write_bytes(b'{"t":[1,0,0,')
    part = FileSink(tmp_path, name="out").open(0, 1)
    assert part.t_last() is None and path.read_bytes() == b""
    part.write(bundle((T(1), "a")))
    part.close()
    assert read_file_sink(tmp_path, "out") == [(Meta(*T(1)), "a")]


def test_last_line_found_across_read_blocks(tmp_path, monkeypatch):
    # The tail is read backwards in blocks; make them tiny so lines straddle blocks.
    import driftstream.engine.connectors.file_sink as fs

    monkeypatch.setattr(fs, "_TAIL_BLOCK", 7)
    sink = FileSink(tmp_path, name="out")
    part = sink.open(0, 1)
    part.write(Bundle([(T(i), "x" * i) for i in range(1, 30)]))
    part.close()
    with open(tmp_path / "out-0.jsonl", "ab") as f:
        f.write(b'{"t":[99,0,0,99,[],fal')
    again = sink.open(0, 1)
    assert again.t_last() == Meta(*T(29))
    again.close()
    assert len(read_file_sink(tmp_path, "out")) == 29


def test_corrupt_complete_last_line_is_an_error_not_skipped(tmp_path):
    (tmp_path / "out-0.jsonl").write_bytes(b'{"t":[1,0,0,1,[],false],"value":1}\nnot json\n')
    with pytest.raises(ValueError, match="not a FileSink record"):
        FileSink(tmp_path, name="out").open(0, 1)
    with pytest.raises(ValueError, match=r"out-0\.jsonl:2"):
        read_file_sink(tmp_path, "out")


def test_fsync_once_per_bundle(tmp_path, monkeypatch):
    part = FileSink(tmp_path, name="out").open(0, 1)  # opening may fsync the directory
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    part.write(bundle((T(1), "a"), (T(2), "b"), (T(3), "c")))
    assert len(calls) == 1
    part.write(bundle((T(4), "d")))
    part.write(Bundle([(T(i), i) for i in range(5, 500)]))
    assert len(calls) == 3
    part.close()


def test_non_json_payload_names_the_sink_and_t_and_writes_nothing(tmp_path):
    part = FileSink(tmp_path, name="orders").open(0, 1)
    part.write(bundle((T(1), "ok")))
    for bad in (object(), {1, 2}, float("nan")):
        with pytest.raises(TypeError) as info:
            part.write(bundle((T(2), "fine"), (T(3, 1), bad)))
        msg = str(info.value)
        assert "'orders'" in msg and "t=(3, 0, 0, 3, (1,), False)" in msg
    # The whole bundle failed before anything was written: the file and t_last are unchanged.
    assert part.t_last() == Meta(*T(1))
    part.write(bundle((T(2), "fine")))
    part.close()
    assert [v for _, v in read_file_sink(tmp_path, "orders")] == ["ok", "fine"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(JSON_VALUES, min_size=1, max_size=5))
def test_any_json_value_reads_back_as_json_gives_it(values):
    """Whatever encoder writes the lines (orjson, or json for integers past 64 bits), a value
    reads back as ``json.loads(json.dumps(value))``: text in any script, None, big integers."""
    with tempfile.TemporaryDirectory() as d:
        sink = FileSink(d, name="out")
        part = sink.open(0, 1)
        part.write(Bundle([(T(i), v) for i, v in enumerate(values)]))
        part.close()
        assert [v for _, v in read_file_sink(d, "out")] == [json.loads(json.dumps(v)) for v in values]


native = pytest.mark.skipif(file_sink.NATIVE is None, reason="the C lines are not built (tests/ordering/test_in_order_path.py says why)")


def c_lines(elements):
    """The C's lines, called directly: json_lines would quietly take the Python's if the C raised."""
    return file_sink.NATIVE.json_lines(elements, json_bytes, orjson.dumps, ORJSON_OPTIONS, file_sink._line)


@native
def test_the_c_lines_are_the_pythons_bytes_for_odd_metas_and_payloads():
    """What the C writes itself (plain 6-tuples of small ints) and what it hands back to the
    Python per line (a Meta namedtuple, which sends json_bytes' whole record to json: \\u
    escapes; ints past 64 bits; more than 8 child ids; a bool as a time), payloads orjson
    refuses (big ints, bytes) or writes with a null in it."""

    @dataclasses.dataclass
    class Row:
        word: str
        n: int

    payloads = ["été", None, "nullify", {"w": None}, 2**70, [1, 2**65], b"\xff", b"ok", Row("ü", 3), {7: "int key"},
                (1, 2), 1.5, -0.0, True, {"nested": [{"a": "日本"}]}]
    metas = [T(1), T(2, 3, 4), T(3, tombstone=True), Meta(4, 0, 0, 4), T(2**70), T(5, *range(9)), (True, 0, 0, 6, (), False),
             (-7, 1, 2, 3, (0,), False)]
    elements = [(m, p) for m in metas for p in payloads]
    assert c_lines(elements) == python_json_lines(elements)
    assert c_lines([]) == python_json_lines([]) == b""


@native
@settings(max_examples=200, deadline=None)
@given(values=st.lists(JSON_VALUES, max_size=8))
def test_the_c_lines_are_the_pythons_bytes(values):
    elements = [(T(i, i % 3), v) for i, v in enumerate(values)]
    assert c_lines(elements) == json_lines(elements) == python_json_lines(elements)


@pytest.mark.parametrize("bad", [object(), float("nan"), {"deep": [float("inf")]}])
def test_a_payload_the_c_refuses_is_named_by_the_python(bad):
    with pytest.raises(TypeError) as info:
        json_lines([(T(1), "fine"), (T(2, 5), bad)], "orders")
    assert "FileSink 'orders' cannot write the element at t=(2, 0, 0, 2, (5,), False)" in str(info.value)


def test_read_file_sink_merges_partitions_in_meta_order(tmp_path):
    sink = FileSink(tmp_path, name="out")
    parts = [sink.open(p, 3) for p in range(3)]
    # Global times interleave across partitions; each file is in Meta order by itself.
    parts[0].write(bundle((T(1, partition=0), "p0-1"), (T(4, partition=0), "p0-4")))
    parts[1].write(bundle((T(2, partition=1), "p1-2"), (T(2, 0, partition=1), "p1-2.0")))
    parts[2].write(bundle((T(0, partition=2), "p2-0"), (T(3, partition=2), "p2-3")))
    parts[0].write(bundle((T(6, partition=0), "p0-6")))
    parts[1].write(bundle((T(5, partition=1), "p1-5")))
    for part in parts:
        part.close()
    # Another sink in the same directory whose name starts the same is not picked up.
    other = FileSink(tmp_path, name="out-x").open(0, 1)
    other.write(bundle((T(-1), "other")))
    other.close()
    got = read_file_sink(tmp_path, "out")
    assert [v for _, v in got] == ["p2-0", "p0-1", "p1-2", "p1-2.0", "p2-3", "p0-4", "p1-5", "p0-6"]
    assert [m for m, _ in got] == sorted(m for m, _ in got)
    assert sink.read() == got
    assert read_file_sink(tmp_path / "missing", "out") == []


def test_path_template(tmp_path):
    template = str(tmp_path / "{name}" / "part-{partition:03d}.jsonl")
    sink = FileSink(template, name="words")
    for p in (0, 11):
        part = sink.open(p, 12)
        part.write(bundle((T(p + 1, partition=p), p)))
        part.close()
    assert sorted(os.listdir(tmp_path / "words")) == ["part-000.jsonl", "part-011.jsonl"]
    assert [v for _, v in read_file_sink(template, "words")] == [0, 11]
    assert reopened_last(sink, 11, 12) == Meta(*T(12, partition=11))


@pytest.mark.parametrize("template", ["/x/{name}.jsonl", "/x/{name}-{part}.jsonl"])
def test_bad_templates_are_rejected_when_the_flow_is_defined(template):
    with pytest.raises(ValueError):
        FileSink(template, name="out")


def test_partition_out_of_range_and_closed_partition(tmp_path):
    sink = FileSink(tmp_path, name="out")
    with pytest.raises(ValueError):
        sink.open(2, 2)
    part = sink.open(0, 1)
    part.close()
    part.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        part.write(bundle((T(1), "a")))


def test_failed_write_blocks_further_writes_until_reopened(tmp_path, monkeypatch):
    sink = FileSink(tmp_path, name="out")
    part = sink.open(0, 1)
    part.write(bundle((T(1), "a")))

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        part.write(bundle((T(2), "b")))
    monkeypatch.undo()
    with pytest.raises(OSError, match="reopen"):
        part.write(bundle((T(3), "c")))
    part.close()
    assert reopened_last(sink) == Meta(*T(2))  # written, just not known to be durable


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6),
    cut=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_crash_anywhere_in_the_last_bundle_then_replay_is_exact(sizes, cut):
    """Write bundles, tear the last one at any byte (inside a multi-byte character too: the
    lines are UTF-8), reopen, replay after t_last(): the file ends up holding every element
    exactly once, in order."""
    n = sum(sizes)
    elements = [(T(i, i % 3), f"v{i}-été-€-\U0001F600") for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        sink = FileSink(d, name="out")
        part = sink.open(0, 1)
        i = 0
        for size in sizes:
            part.write(Bundle(elements[i : i + size]))
            i += size
        part.close()
        path = os.path.join(d, "out-0.jsonl")
        with open(path, "rb") as f:
            data = f.read()
        # Keep everything before the last bundle plus a prefix of it (the crash).
        last_len = len(b"".join(line + b"\n" for line in data.split(b"\n")[-1 - sizes[-1] : -1]))
        keep = len(data) - last_len + int(cut * last_len)
        with open(path, "r+b") as f:
            f.truncate(keep)
        again = sink.open(0, 1)
        again.write(Bundle(elements).after(again.t_last()))
        again.close()
        assert read_file_sink(d, "out") == [(Meta(*m), v) for m, v in elements]
        with open(path, "rb") as f:
            assert f.read() == data
