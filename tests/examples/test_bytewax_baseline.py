"""The Bytewax baseline: its per-element functions here, and a real run of the job under
Bytewax's interpreter (skipped where there is none, see bytewax_baseline.py's install)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from driftstream.examples.inverted_index.bytewax_baseline import (
    GrowingFiles,
    bytewax_python,
    document_changes,
    index_step,
    run_bytewax_backlog,
)
from driftstream.examples.inverted_index.documents import page_of_line, word_positions
from driftstream.examples.inverted_index.flink_baseline import check_changes

DOCS = [{"page_id": 10 + i, "text": f"the quick fox {i} jumps over the lazy dog number {i % 7}"} for i in range(120)]


def test_the_functions_give_what_the_order_free_check_expects():
    records, index = [], {}
    for doc in DOCS:
        for change in document_changes(doc):
            index[change[0]], line = index_step(index.get(change[0]), change)
            records.append(json.loads(line))
    assert check_changes(records, DOCS) == []
    assert index["the"] == {d["page_id"]: [0, 6] for d in DOCS}


def test_growing_files_count_a_line_once_it_is_complete(tmp_path):
    out = GrowingFiles(tmp_path / "out")
    assert out.poll() == [] and out.first_output is None  # no directory yet
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / "part_1", "w") as f:
        f.write('{"page_id":1,"df":1}\n{"page_id":-20}\n{"page_id"')
        f.flush()
        assert [page_of_line(line) for line in out.poll()] == [1, -20]
        f.write(":3}\n")
    assert out.poll() == [b'{"page_id":3}'] and out.poll() == []
    assert page_of_line(index_step(None, ("w", 123456789012345, [0]))[1].encode()) == 123456789012345


def _bytewax_python() -> str:
    try:
        python = bytewax_python()
    except RuntimeError as e:
        pytest.skip(f"no Bytewax interpreter: {e}")
    module = "driftstream.examples.inverted_index.bytewax_baseline"
    if subprocess.run([python, "-c", f"import bytewax, {module}"], capture_output=True).returncode != 0:
        pytest.skip(f"{python} cannot import bytewax and {module} (see its install)")
    return python


@pytest.mark.slow
def test_a_backlog_run_with_snapshots_is_correct_and_leaves_no_process(tmp_path):
    figures = run_bytewax_backlog(DOCS, tmp_path, snapshot_interval=1, python=_bytewax_python())
    assert figures["correct"] is True, figures["problems"]
    assert figures["records"] == sum(len(word_positions(d["text"])) for d in DOCS)
    assert len(figures["completions"]) == len(DOCS)
    assert any((tmp_path / "recovery").iterdir())  # its recovery partitions were made and used
    alive = [p for p in filter(str.isdigit, os.listdir("/proc"))
             if str(tmp_path) in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert alive == []


@pytest.mark.slow
def test_a_failing_job_is_reported_not_hidden(tmp_path):
    """A job whose workers cannot run (here: a port taken by another program, which Bytewax
    retries forever) gives problems once its time is up, not figures."""
    import socket

    from driftstream.examples.inverted_index import bytewax_baseline

    with socket.socket() as taken:
        # the run before may leave the port in TIME_WAIT; a listener still holds it alone
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", bytewax_baseline.BASE_PORT))
        taken.listen()
        # 4 s from the launch: over twice what a working run of these 5 documents takes to finish
        figures = run_bytewax_backlog(DOCS[:5], tmp_path, snapshot_interval=None, python=_bytewax_python(), timeout=4)
    assert figures["correct"] is False and figures["problems"]


@pytest.mark.slow
def test_the_files_basis_one_worker_row_is_correct_with_and_without_recovery(tmp_path):
    from driftstream.examples.inverted_index.bytewax_baseline import run_bytewax_files
    from driftstream.examples.inverted_index.files_basis import write_files

    python = _bytewax_python()
    paths = write_files(DOCS, tmp_path / "in")
    for interval in (1, None):
        row = run_bytewax_files(DOCS, paths, tmp_path / f"run-{interval}", snapshot_interval=interval, python=python)
        assert row["correct"] is True, row["problems"]
        assert row["records"] == sum(len(word_positions(d["text"])) for d in DOCS)
        assert 0 < row["seconds_from_first_read"] < row["seconds_from_launch"] and row["cpu_s"] > 0
    assert any((tmp_path / "run-1" / "recovery").iterdir()) and not (tmp_path / "run-None" / "recovery").exists()
