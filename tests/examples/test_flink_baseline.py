"""The Flink baseline: the order-free check of its output (always), and one small real run
per mode on a local Flink mini cluster (slow; needs an interpreter with pyflink, see the
module's docstring: ``DRIFTSTREAM_FLINK_PYTHON``)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

from driftstream.examples.inverted_index.documents import word_positions
from driftstream.examples.inverted_index.flink_baseline import check_changes, flink_python, run_flink_backlog, run_flink_latency

DOCS = [{"page_id": 1000 + i, "text": " ".join(f"w{(i * j) % 13}" for j in range(1, 9)) + f" The page{i % 7}"} for i in range(60)]


def changes_in_order(docs: list) -> list:
    """The change records of ``docs`` applied in the given order (df as that order makes it)."""
    pages: dict = {}
    out = []
    for d in docs:
        for w, p in word_positions(d["text"]).items():
            pages.setdefault(w, set()).add(d["page_id"])
            out.append({"op": "add", "word": w, "page_id": d["page_id"], "positions": p, "df": len(pages[w])})
    return out


def test_any_application_order_passes():
    shuffled = random.Random(3).sample(DOCS, len(DOCS))
    records = changes_in_order(shuffled)
    random.Random(4).shuffle(records)  # two writers' files, read in any order
    assert check_changes(records, DOCS) == []


def test_a_duplicate_record_fails():
    records = changes_in_order(DOCS)
    problems = check_changes([*records, records[5]], DOCS)
    assert any("more than once" in p for p in problems)


def test_a_missing_record_fails():
    records = changes_in_order(DOCS)
    problems = check_changes(records[:10] + records[11:], DOCS)
    assert any("missing" in p for p in problems)


def test_a_wrong_df_fails():
    records = changes_in_order(DOCS)
    i = next(i for i, r in enumerate(records) if r["df"] > 1)
    records[i] = {**records[i], "df": records[i]["df"] - 1}  # the same df twice for one word
    problems = check_changes(records, DOCS)
    assert problems and "df values" in problems[-1]


def test_wrong_positions_fail():
    records = changes_in_order(DOCS)
    records[0] = {**records[0], "positions": [99]}
    problems = check_changes(records, DOCS)
    assert any("missing" in p for p in problems) and any("unexpected" in p for p in problems)


def _flink_python(job_module: str = "driftstream.examples.inverted_index.documents") -> str:
    """The Flink interpreter, if it can import pyflink and ``job_module``; else the test is skipped."""
    try:
        python = flink_python()
    except RuntimeError as e:
        pytest.skip(f"no Flink interpreter: {e}")
    try:
        ok = subprocess.run([python, "-c", f"import pyflink, {job_module}"], capture_output=True).returncode == 0
    except OSError:  # $DRIFTSTREAM_FLINK_PYTHON names no program
        ok = False
    if not ok:
        pytest.skip(f"{python} cannot import pyflink and {job_module} (see driftstream.examples.flink_job)")
    return python


def _processes_mentioning(text: str) -> list:
    """Live processes whose command line mentions ``text`` (the job's, the JVM's log path is in the workdir)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_backlog_run_is_correct_and_leaves_no_process(tmp_path):
    python = _flink_python()
    figures = run_flink_backlog(DOCS, tmp_path, checkpoint_interval=0.2, python=python)
    assert figures["correct"] is True, figures["problems"]
    assert figures["records"] == sum(len(word_positions(d["text"])) for d in DOCS)
    assert 0 < figures["seconds_after_first_output"] <= figures["seconds"]
    assert len(figures["completions"]) == len(DOCS)
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_a_latency_run_is_correct_and_leaves_no_process(tmp_path):
    python = _flink_python()
    figures = run_flink_latency(DOCS, tmp_path, rate=20.0, checkpoint_interval=0.1, skip=10, python=python)
    assert figures["correct"] is True, figures["problems"]
    assert figures["latency_ms"]["count"] == len(DOCS) - 10
    assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["max"]
    assert figures["achieved_rate"] == pytest.approx(20.0, rel=0.2)
    assert _processes_mentioning(str(tmp_path)) == []
