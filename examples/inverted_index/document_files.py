"""Documents as JSON-lines files: the input of the engines that read files (Spark's
native query, Flink), since neither can read Kafka here.

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> write_documents([{"page_id": i, "text": "a"} for i in range(250)], d)
3
>>> sorted(p.name for p in d.iterdir())[0], (d / "docs-000000.json").read_text().splitlines()[0]
('docs-000000.json', '{"page_id": 0, "text": "a"}')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

#: Documents per file. A text file is one split for Spark and Flink: both cores need
#: several files, and Spark's micro-batches are whole files (``maxFilesPerTrigger``).
DOCS_PER_FILE = 100


def document_line(doc: dict) -> str:
    """One document as a JSON line (``page_id`` and ``text`` only)."""
    return json.dumps({"page_id": doc["page_id"], "text": doc["text"]}) + "\n"


def write_documents(docs: Sequence[dict], directory: Path, docs_per_file: int = DOCS_PER_FILE) -> int:
    """Write ``docs`` as files of ``docs_per_file`` lines, named in order; returns the file count."""
    directory.mkdir(parents=True, exist_ok=True)
    files = 0
    for start in range(0, len(docs), docs_per_file):
        (directory / f"docs-{files:06d}.json").write_text("".join(document_line(d) for d in docs[start : start + docs_per_file]))
        files += 1
    return files
