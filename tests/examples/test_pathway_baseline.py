"""The Pathway baseline (examples/inverted_index/pathway_baseline.py): the changelog's parsing and
the reader's order here, and a real run under Pathway's interpreter (skipped where there is none)."""

from __future__ import annotations

import subprocess

import orjson
import pytest

from driftstream.examples.inverted_index.files_basis import check_records, file_order, write_files
from driftstream.examples.inverted_index.ground_truth import reference_changes
from driftstream.examples.inverted_index.pathway_baseline import (
    alternate_lines,
    parse_changelog,
    pathway_python,
    run_pathway_files,
    word_pairs,
)

DOCS = [{"page_id": 10 + i, "text": f"the fox {i} and the dog {i % 3}"} for i in range(41)]


def test_the_reader_takes_the_documents_in_the_lists_order(tmp_path):
    paths = write_files(DOCS, tmp_path)
    assert [orjson.loads(line)["page_id"] for line in alternate_lines(paths)] == [d["page_id"] for d in DOCS]
    assert file_order(DOCS, "pathway") == DOCS


def test_a_changelogs_insertions_are_the_change_records_and_its_retractions_are_counted():
    # The changelog a per-document commit gives: each word's row is retracted when the next page adds it.
    lines, rows = [], {}
    for time, record in enumerate(reference_changes(DOCS)):
        if record["word"] in rows:
            lines.append(orjson.dumps({**rows[record["word"]], "diff": -1, "time": 2 * time}))
        rows[record["word"]] = {"word": record["word"], "df": record["df"], "page_id": record["page_id"], "positions": record["positions"]}
        lines.append(orjson.dumps({**rows[record["word"]], "diff": 1, "time": 2 * time}))
    records, retractions = parse_changelog(lines)
    assert records == reference_changes(DOCS)
    assert retractions == len(records) - len({r["word"] for r in records})
    assert check_records(records, DOCS, DOCS) == []


def test_word_pairs_are_the_tokenizers():
    assert word_pairs("To be or not to be") == [("to", [0, 4]), ("be", [1, 5]), ("or", [2]), ("not", [3])]


def _pathway_python() -> str:
    try:
        python = pathway_python()
    except RuntimeError as e:
        pytest.skip(f"no Pathway interpreter: {e}")
    module = "driftstream.examples.inverted_index.pathway_baseline"
    if subprocess.run([python, "-c", f"import pathway, {module}"], capture_output=True).returncode != 0:
        pytest.skip(f"{python} cannot import pathway and {module} (see its install)")
    return python


@pytest.mark.slow
def test_a_run_gives_every_change_record_in_the_lists_order(tmp_path):
    paths = write_files(DOCS, tmp_path / "in")
    row = run_pathway_files(DOCS, paths, tmp_path / "run", python=_pathway_python())
    assert row["correct"] is True, row["problems"]
    assert row["records"] == len(reference_changes(DOCS)) and row["retractions"] > 0
    assert 0 < row["seconds_from_first_read"] < row["seconds_from_launch"]
    assert row["cpu_s"] > 0  # its process tree's, from the kernel
