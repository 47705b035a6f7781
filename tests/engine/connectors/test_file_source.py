"""FileSource on real files: times from the file alone (a replay from any position, read in
any sizes, across block boundaries, gives the same elements with the same t), lines that do
not decode become dead letters at their own t, and a flow on Ray reading a backlog of files
is exact through kills."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine import Flow
from driftstream.engine.connectors import file_source
from driftstream.engine.connectors.file_source import FileSource
from driftstream.engine.model.errors import DeadLetter
from driftstream.engine.testing import MemorySink
from tests.conftest import flow_actors
from tests.status_wait import kill_after

LINE = st.one_of(
    st.builds(lambda n, t, s: json.dumps({"n": n, "time": t, "s": s}, ensure_ascii=False),
              st.integers(0, 99), st.floats(0, 50, allow_nan=False), st.text(max_size=6)),
    st.sampled_from(["not json", '{"n": 1}', "", "   "]),  # no time, blank lines
)


def _write(path, lines, final_newline=True):
    text = "\n".join(lines) + ("\n" if final_newline else "")
    path.write_bytes(text.encode())


def _read_all(part, sizes):
    out, i = [], 0
    while not part.done:
        out.extend(part.read(sizes[i % len(sizes)]))
        i += 1
    return out


def _plain(elements):
    return [(m, v.element.offset if isinstance(v, DeadLetter) else v) for m, v in elements]


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(LINE, min_size=1, max_size=30), final_newline=st.booleans(), block=st.integers(1, 64),
       sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4), cut=st.integers(0, 40))
def test_a_replay_from_any_position_read_in_any_sizes_gives_the_same_times(tmp_path_factory, lines, final_newline, block, sizes, cut):
    path = tmp_path_factory.mktemp("fs") / "events.jsonl"
    _write(path, lines, final_newline)
    source = FileSource(str(path), timestamp=lambda e: e["time"])
    first = source.open(0, source_id=3)
    whole = _read_all(first, [10_000])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(file_source, "READ_BYTES", block)  # lines cross block boundaries
        part = source.open(0, source_id=3)
        head = []
        while not part.done and len(head) < cut:
            head.extend(part.read(sizes[0]))
        replay = source.open(0, source_id=3, start=part.position())
        assert _plain(head + _read_all(replay, sizes)) == _plain(whole)
    metas = [m for m, _ in whole]
    assert metas == sorted(metas) and len(set(metas)) == len(metas)  # t rises through the file
    good = [json.loads(x) for x in lines if x.strip() and x.startswith("{") and "time" in x]
    assert [v for _, v in whole if not isinstance(v, DeadLetter)] == good
    bad = [x for x in lines if x.strip() and not (x.startswith("{") and "time" in x)]
    assert [v.element.value for _, v in whole if isinstance(v, DeadLetter)] == bad
    assert first.position()[0] == path.stat().st_size and first.lag() == 0


def test_lines_that_fail_before_the_first_time_wait_for_it_and_name_the_file_and_offset(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, ["oops", '{"time": 5}', '{"time": 4}', '{"no_time": 1}'])
    source = FileSource(str(path), timestamp=lambda e: e["time"])
    source.step_name = "events"
    out = source.open(0, source_id=0).read(10)
    assert [(m[0], m[3]) for m, _ in out] == [(5000, 0), (5000, 5), (5000, 17), (5000, 29)]
    letters = [v for _, v in out if isinstance(v, DeadLetter)]
    assert [(d.step, d.element.topic, d.element.offset, d.element.value) for d in letters] == [
        ("events", str(path), 0, "oops"), ("events", str(path), 29, '{"no_time": 1}')]
    assert "KeyError: 'time'" in letters[1].error


def test_without_a_timestamp_a_line_is_timed_by_its_byte_offset_and_files_are_partitions(tmp_path):
    for name, rows in (("b.jsonl", [3, 4]), ("a.jsonl", [1, 2])):
        _write(tmp_path / name, [json.dumps(r) for r in rows])
    source = FileSource(str(tmp_path / "*.jsonl"))
    assert source.partitions() == 2 and source.alignment_slack is None
    assert [(m[0], m[2], v) for m, v in source.open(1, 0).read(5)] == [(0, 1, 3), (2, 1, 4)]  # sorted paths: b is 1
    with pytest.raises(ValueError, match="no file matches"):
        FileSource([str(tmp_path / "a.jsonl"), str(tmp_path / "missing.jsonl")])


def _count(n, _e):
    n = (n or 0) + 1
    return n, n


def _sum(s, e):
    s = (s or 0) + e["v"]
    return s, s


def test_a_flow_reads_files_with_their_dead_letters_on_the_simulator(tmp_path):
    for p in range(2):
        _write(tmp_path / f"part-{p}.jsonl", [json.dumps({"k": i % 5, "time": i}) for i in range(p, 200, 2)] + ["{bad"])
    flow = Flow("files").dead_letters(MemorySink("dlq"))
    (flow.source(FileSource(str(tmp_path / "part-*.jsonl"), timestamp=lambda e: e["time"]), name="events")
     .key_by(lambda e: e["k"], name="k").stateful_map(_count, name="count").sink(MemorySink("out")))
    result = flow.run(runtime="simulator")
    assert sorted(result.output("out")) == sorted(n for k in range(5) for n in range(1, 41))
    assert [d.element.value for d in result.output("dlq")] == ["{bad", "{bad"]


def test_a_flow_on_ray_reads_a_backlog_of_files_exactly_once_through_kills(ray_session, tmp_path):
    # 30,000 lines a file (was 50,000): the kills, at 5,000 and 15,000 released, still leave
    # five sixths of the backlog to read.
    n, files = 90_000, 3
    for p in range(files):
        lines = [json.dumps({"k": i % 97, "v": i, "time": i / 1000}) for i in range(p, n, files)]
        _write(tmp_path / f"in-{p}.jsonl", lines[:10_000] + ["{torn"] + lines[10_000:])
    name = f"files-{uuid.uuid4().hex[:6]}"
    flow = Flow(name).dead_letters(FileSink(tmp_path / "dlq", name="dlq"))
    (flow.source(FileSource(str(tmp_path / "in-*.jsonl"), timestamp=lambda e: e["time"]), name="events")
     .key_by(lambda e: e["k"], name="k").stateful_map(_sum, name="sum")
     .sink(FileSink(tmp_path / "out", name="sums")))
    handle = flow.start(parallelism=2, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    try:
        kill_after(handle, f"{name}/events/0", 5_000)
        kill_after(handle, f"{name}/k/1", 15_000)
        handle.wait(timeout=120)
    finally:
        if flow_actors(name + "/"):
            handle.stop(timeout=60)
    sums: dict = {}
    expected = []
    for i in range(n):  # the file lines in time order: i / 1000 s
        sums[i % 97] = sums.get(i % 97, 0) + i
        expected.append(sums[i % 97])
    got = [v for _, v in read_file_sink(tmp_path / "out", "sums")]
    assert sorted(got) == sorted(expected)
    assert len(got) == n
    assert [(v["element"]["topic"][-10:], v["element"]["value"]) for _, v in read_file_sink(tmp_path / "dlq", "dlq")] == [
        (f"in-{p}.jsonl", "{torn") for p in range(files)]
