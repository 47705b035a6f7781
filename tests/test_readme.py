"""README.md says what is true: its Python blocks (and those of docs/api.md, the rest of the
API's examples) run as written and their asserts hold, its links reach files and headings
that exist, and its test command is CI's.

A block runs in the fast tier on the simulator: ``Flow.run`` is redirected to
``runtime="simulator"`` (same seed and parallelism), which gives the same output as Ray by
the engine's determinism. A block that calls ``run`` on Ray also runs as written on the Ray
session (slow tier). A block whose first line is ``# needs: ray, kafka`` (what it needs
beyond the engine) runs only there: it starts flows or brokers the simulator has no stand-in
for. Each block runs in a fresh namespace with a temporary directory as the current one.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from driftstream.engine.api.flow import Flow

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: the documents whose ```python blocks run: README and the API's examples it sends readers to
EXAMPLE_DOCS = ["README.md", "docs/api.md"]
#: what a ``# needs:`` line may name: Ray (the block runs on the ray_session) and Kafka (the
#: block starts its own broker with local_kafka(), as a reader would)
NEEDS = {"ray", "kafka"}


@dataclass(frozen=True)
class Block:
    """A fenced ```python block of a document: where it starts and what it needs."""

    line: int
    code: str
    needs: frozenset
    doc: str = "README.md"

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def runs_on_ray(self) -> bool:
        """Whether the block uses Ray as written: a ``needs: ray`` or a ``run`` without the simulator."""
        return "ray" in self.needs or any("simulator" not in call for call in re.findall(r"\.run\([^)]*\)", self.code))


def readme_blocks(text: str, doc: str = "README.md") -> list:
    """The ```python blocks of a Markdown text, the document ``doc``."""
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```$", text, re.S | re.M):  # also fences indented in a list
        code = textwrap.dedent(m.group(2))
        first = code.split("\n", 1)[0]
        needs = frozenset()
        if first.startswith("# needs:"):
            needs = frozenset(n.strip() for n in first.removeprefix("# needs:").split(","))
        blocks.append(Block(text.count("\n", 0, m.start()) + 2, code, needs, doc))
    return blocks


BLOCKS = [block for doc in EXAMPLE_DOCS for block in readme_blocks((ROOT / doc).read_text(), doc)]


def _exec(block: Block) -> None:
    namespace = {"__name__": f"readme_{block.line}"}  # not __main__: functions travel to actors by value
    exec(compile(block.code, block.id, "exec"), namespace)


def test_blocks_indented_in_a_list_are_found():
    text = "x\n- item\n\n  ```python\n  # needs: ray\n  a = 1\n  ```\n"
    assert [(b.line, b.code, b.needs) for b in readme_blocks(text)] == [(5, "# needs: ray\na = 1\n", {"ray"})]


def test_blocks_are_found_and_their_needs_known():
    for doc, least in [("README.md", 6), ("docs/api.md", 3)]:
        found = sum(block.doc == doc for block in BLOCKS)
        assert found >= least, f"{doc}: {found} python blocks found, {least} expected: is the fence still ```python?"
    for block in BLOCKS:
        assert block.needs <= NEEDS, f"{block.id}: '# needs:' names {sorted(block.needs - NEEDS)}; known: {sorted(NEEDS)}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.needs], ids=lambda b: b.id)
def test_block_runs_on_the_simulator(block, monkeypatch, tmp_path):
    run = Flow.run

    def on_simulator(self, parallelism=1, runtime="ray", seed=None, address=None, **options):
        return run(self, parallelism, runtime="simulator", seed=seed, **options)

    monkeypatch.setattr(Flow, "run", on_simulator)
    monkeypatch.chdir(tmp_path)
    _exec(block)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs_on_ray()], ids=lambda b: b.id)
def test_block_runs_on_ray(block, ray_session, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _exec(block)


def test_every_block_runs_somewhere():
    for block in BLOCKS:
        assert not block.needs or block.runs_on_ray(), f"{block.id} needs {sorted(block.needs)} and no test runs it"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", path.read_text(), re.M)}


def _broken(link: str, doc: Path) -> Optional[str]:
    """Why the relative link ``link`` of ``doc`` leads nowhere, or None."""
    target, _, anchor = link.partition("#")
    path = (doc.parent / target) if target else doc
    if not path.exists():
        return f"no file {target}"
    if anchor and (path.suffix != ".md" or anchor not in _anchors(path)):
        return f"no heading #{anchor} in {path.relative_to(ROOT)}"
    return None


#: README and the documents it sends readers to whose sections move between them
LINKED_DOCS = ["README.md", "examples/benchmarks/README.md", "docs/architecture.md", "docs/operations.md", "docs/api.md"]


@pytest.mark.parametrize("name", LINKED_DOCS)
def test_links_reach_files_and_headings(name):
    doc = ROOT / name
    links = re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    broken = {link: why for link in local if (why := _broken(link, doc))}
    assert not broken, f"{name}: {broken}"


def test_readme_links_the_docs_benchmarks_and_lab_book():
    links = set(re.findall(r"\]\(([^)#\s]+)", README.read_text()))
    assert {"docs/operations.md", "docs/architecture.md", "docs/api.md", "examples/benchmarks/README.md",
            "examples/inverted_index/results/README.md", "LICENSE"} <= links


def test_slug_follows_github():
    assert _slug("The README's figures (2026-12-04)") == "the-readmes-figures-2026-12-04"
    assert _slug("status() and the CLI's status view") == "status-and-the-clis-status-view"
    assert _slug("Windows, and what \"late\" means") == "windows-and-what-late-means"


def test_the_test_commands_are_cis_and_the_fast_tier():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    text = README.read_text()
    assert ci == ".venv/bin/python -m pytest" and f"\n{ci}\n" in text
    assert '\n.venv/bin/python -m pytest -m "not slow"\n' in text
    assert text.index('-m "not slow"') < text.index(f"\n{ci}\n"), "the fast tier comes first"
