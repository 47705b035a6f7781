"""The files basis of the throughput benchmark (examples/inverted_index/files_basis.py): its pure
parts, the plain loop as a process of its own, and driftstream's row on a real Ray session."""

from __future__ import annotations

import json

import orjson

from driftstream.examples.inverted_index.files_basis import (
    check_records,
    file_order,
    files_row,
    files_table,
    index_files,
    run_driftstream,
    run_loop,
    step_kind,
    step_kind_costs,
    step_kind_table,
    with_ratios,
    write_files,
)
from driftstream.examples.inverted_index.ground_truth import reference_changes
from driftstream.examples.inverted_index.documents import word_positions

DOCS = [{"page_id": 100 + i, "text": f"the quick fox {i} jumps over the lazy dog {'x' * (i % 5)} number {i % 7}"} for i in range(50)]


def _expected(docs):
    return sum(len(word_positions(d["text"])) for d in docs)


def test_the_files_alternate_the_documents_and_driftstreams_order_merges_them_by_offset(tmp_path):
    paths = write_files(DOCS, tmp_path)
    lines = [[orjson.loads(line)["page_id"] for line in p.read_bytes().splitlines()] for p in paths]
    assert lines == [[d["page_id"] for d in DOCS[0::2]], [d["page_id"] for d in DOCS[1::2]]]
    order = file_order(DOCS, "driftstream")
    assert sorted(d["page_id"] for d in order) == sorted(d["page_id"] for d in DOCS)
    # the line at each byte offset, file 0 before file 1 at the same offset
    at = sorted((off, i, pid) for i, p in enumerate(paths)
                for off, pid in _offsets(p.read_bytes()))
    assert [d["page_id"] for d in order] == [pid for _, _, pid in at]
    assert order != DOCS  # the lines' lengths differ, so the merge is not the alternation


def _offsets(data: bytes):
    offset = 0
    for line in data.splitlines(keepends=True):
        yield offset, orjson.loads(line)["page_id"]
        offset += len(line)


def test_the_plain_loop_writes_the_references_records_in_its_order(tmp_path):
    paths = write_files(DOCS, tmp_path / "in")
    assert index_files(paths, tmp_path / "out.jsonl", tmp_path / "stamp") == _expected(DOCS)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert records == reference_changes(file_order(DOCS, "loop"))
    assert float((tmp_path / "stamp").read_text()) > 0


def test_the_loops_row_times_its_process_from_launch_and_from_first_read(tmp_path):
    paths = write_files(DOCS, tmp_path / "in")
    row = run_loop(DOCS, paths, tmp_path / "loop")
    assert row["correct"] is True, row["problems"]
    assert row["records"] == _expected(DOCS)
    # the interpreter's start is in the launch clock, not in the first read's
    assert 0 < row["seconds_from_first_read"] < row["seconds_from_launch"]
    assert row["cpu_s"] > 0 and row["cpu_us_per_record"] == round(row["cpu_s"] / row["records"] * 1e6, 2)


def test_the_check_catches_a_missing_record_a_duplicate_and_a_wrong_df():
    good = reference_changes(DOCS)
    assert check_records(good, DOCS, DOCS) == []
    assert check_records(good[:-1], DOCS, DOCS)
    assert check_records(good + good[:1], DOCS, DOCS)
    swapped = reference_changes(DOCS[::-1])  # every record there, in another order of the documents
    assert check_records(swapped, DOCS, None) == []  # an engine of no fixed order: df as a multiset
    assert check_records(swapped, DOCS, DOCS)  # but not where the order is known


def test_rows_ratios_and_table():
    rows = with_ratios([files_row("plain loop", 1000, 50, 0.0, 0.5, 1.0, [], cpu_s=0.5),
                        files_row("driftstream, parallelism 2", 1000, 50, 10.0, 11.0, 14.0, ["x"], cpu_s=4.0, output="{t, value}")])
    assert rows[1]["docs_per_s"] == 250.0 and rows[1]["of_loop"] == 0.25 and rows[1]["of_loop_from_first_read"] == 0.167
    assert rows[1]["of_loop_by_cpu"] == 0.125
    table = files_table(rows)
    assert "| driftstream, parallelism 2 | 250.0 | 50 | 4.0 | 3.0 | 333.3 | 0.25 / 0.167 | 4.0 | 80000.0 | 0.125 | NO | {t, value} |" in table
    assert with_ratios([files_row("x", 1, 1, 0.0, None, 1.0, [])])[0]["of_loop"] is None  # no loop row: no ratio


def test_step_kinds_of_stacks_and_their_costs(tmp_path):
    assert step_kind(["a (engine/connectors/file_sink.py:1)", "dumps (json/__init__.py:1)"]).startswith("sink")
    assert step_kind(["StageActor.__init__ (engine/runtime/actors.py:1)", "x (<frozen importlib._bootstrap>:1)"]).startswith("start-up")
    assert step_kind(["x (engine/runtime/stage_snapshots.py:1)", "put (snapshots/backend.py:2)"]).startswith("snapshots")
    assert step_kind(["x (ray/_private/worker.py:1)", "y (ray/_private/x.py:2)"]) == "Ray and asyncio (no driftstream frame)"
    (tmp_path / "p1-7-StageActor-1.txt").write_text(
        "main (a.py:1);FlatMap.run (engine/runtime/operators.py:183);tokenize (examples/inverted_index/documents.py:37) 300\n"
        "main (a.py:1);Worker.main_loop (ray/_private/worker.py:1069) 5000\n"
        "main (a.py:1);Outbound.route (engine/runtime/outbound.py:139) 100\n")
    (tmp_path / "p2-8-StageActor-2.txt").write_text("main (a.py:1);Outbound.route (engine/runtime/outbound.py:139) 100\n")
    costs = step_kind_costs(tmp_path, [{"engine": "p1", "records": 1000, "profile_tag": "p1-7"}, {"engine": "loop", "records": 5}], rate=100)
    assert len(costs) == 1 and costs[0]["sampled_s"] == 4.0  # the waits left out
    kinds = {k["kind"]: k for k in costs[0]["kinds"]}
    assert kinds["the user's functions (document_words, index_update, the key)"]["us_per_record"] == 3000.0
    assert kinds["routing (key_by, key groups)"]["share"] == 0.25
    assert "| routing (key_by, key groups) | 1000.0 (25%) |" in step_kind_table(costs)
    # with the kernel's CPU of the run, the samples give the shares only
    scaled = step_kind_costs(tmp_path, [{"engine": "p1", "records": 1000, "cpu_us_per_record": 40.0, "profile_tag": "p1-7"}], rate=100)
    assert {k["kind"][:7]: k["us_per_record"] for k in scaled[0]["kinds"]} == {"the use": 30.0, "routing": 10.0}


def test_driftstreams_row_on_ray_is_exactly_the_references_output(tmp_path, ray_session):
    paths = write_files(DOCS, tmp_path / "in")
    row = run_driftstream(DOCS, paths, tmp_path, parallelism=2)
    assert row["correct"] is True, row["problems"]
    assert row["records"] == _expected(DOCS)
    assert row["engine"] == "driftstream, parallelism 2"
    # the source stamped its first read in its actor: after the flow's launch, before its end
    assert 0 < row["seconds_from_first_read"] < row["seconds_from_launch"]
    assert row["cpu_s"] > 0.5  # the Ray session's processes counted (an actor's start alone is more)


def test_the_bench_command_runs_the_files_basis_without_a_broker(tmp_path, ray_session, capsys):
    """``driftstream bench inverted-index --throughput --basis files``: no broker is started, the
    rows asked for run over the corpus's documents, and the figures land in --out."""
    from driftstream.examples.inverted_index.benchmark import main

    code = main(["--throughput", "--basis", "files", "--docs", "30", "--engines", "loop,driftstream-p1",
                 "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")])
    results = json.loads((tmp_path / "out" / "throughput-files.json").read_text())
    assert code == 0, results["rows"]
    assert [r["engine"] for r in results["rows"]] == ["plain loop", "driftstream, parallelism 1"]
    assert all(r["correct"] and r["of_loop"] for r in results["rows"]) and results["docs"] == 30
    assert "--basis files" in results["command"] and "broker" not in capsys.readouterr().out
    assert [f["floor"] for f in results["floors"]] == ["driftstream, parallelism 1 >= 0.5 of the plain loop"]
