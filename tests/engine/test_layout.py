"""The engine's rooms import one way (cli -> api -> control -> runtime -> connectors ->
model -> the pure core), no module imports itself back through others, and the engine
never imports the examples. Read from the source with ``ast``: function-level imports
count too."""

from __future__ import annotations

import ast
from pathlib import Path

import driftstream.engine

ENGINE = Path(driftstream.engine.__file__).parent
#: Rank of each room: a module may import its own room and the rooms ranked below it.
RANK = {"model": 1, "connectors": 2, "runtime": 3, "control": 4, "api": 5, "cli": 6}
FACADES = {"driftstream.engine", "driftstream.engine.testing"}  # re-export from every room


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ENGINE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["driftstream", "engine", *parts])


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{path}: relative import of {node.module!r}; import by absolute name")
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _graph() -> dict:
    return {_module_name(p): _imports(p) for p in ENGINE.rglob("*.py")}


def _room(module: str):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in RANK else None


def test_rooms_import_downwards_only():
    wrong = []
    for module, imports in _graph().items():
        room = _room(module)
        if room is None:
            continue
        for imp in imports:
            target = _room(imp)
            if target is not None and RANK[target] > RANK[room]:
                wrong.append(f"{module} imports {imp} ({room} -> {target})")
            if imp in FACADES:
                wrong.append(f"{module} imports the facade {imp}: import the room's module")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    graph = {m: {i for i in imps if i.startswith("driftstream.engine")} for m, imps in _graph().items()}
    state: dict = {}

    def visit(m: str, path: list) -> None:
        state[m] = "open"
        for n in graph.get(m, ()):
            if state.get(n) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]) if n in path else n)
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_the_engine_does_not_import_the_examples():
    bad = {m: sorted(i for i in imps if i.startswith("driftstream.examples")) for m, imps in _graph().items()}
    assert not {m: i for m, i in bad.items() if i}
