"""The engine's rooms import one way (cli -> api -> control -> runtime -> connectors ->
model -> the pure core), no module imports itself back through others, and the engine
never imports the examples. Read from the source with ``ast``: function-level imports
count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import driftstream.engine

ENGINE = Path(driftstream.engine.__file__).parent
#: Rank of each room: a module may import its own room and the rooms ranked below it.
RANK = {"model": 1, "connectors": 2, "runtime": 3, "control": 4, "api": 5, "cli": 6}
FACADES = {"driftstream.engine", "driftstream.engine.testing"}  # re-export from every room


def _module_name(path: Path, root: Path = ENGINE, package: str = "driftstream.engine") -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def _imports(path: Path, modules: set = frozenset()) -> set:
    """The modules ``path`` imports. ``from package import name`` imports the module
    ``package.name`` when that is one of ``modules`` (else the package, for a name in it)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{path}: relative import of {node.module!r}; import by absolute name")
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _graph(root: Path = ENGINE, package: str = "driftstream.engine") -> dict:
    paths = {_module_name(p, root, package): p for p in root.rglob("*.py")}
    return {m: _imports(p, set(paths)) for m, p in paths.items()}


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


def _cycle(graph: dict, prefix: str) -> None:
    """Raise AssertionError naming an import cycle among the modules of ``graph`` under ``prefix``."""
    graph = {m: {i for i in imps if i.startswith(prefix)} for m, imps in graph.items()}
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


def test_no_import_cycle():
    _cycle(_graph(), "driftstream.engine")


def test_a_cycle_through_from_package_import_module_is_found(tmp_path):
    """``from pkg import b`` names the module pkg.b: a cycle through it is one (it was read
    as the package pkg, which hid runtime/operators <-> runtime/arrow_operators)."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from pkg import b\n")
    (root / "b.py").write_text("from pkg.a import f\n")
    graph = _graph(root, "pkg")
    assert graph["pkg.a"] == {"pkg.b"}
    with pytest.raises(AssertionError, match="import cycle"):
        _cycle(graph, "pkg")
    (root / "a.py").write_text("from pkg import f2\n")  # a name in the package, not a module
    assert _graph(root, "pkg")["pkg.a"] == {"pkg"}


def test_the_engine_does_not_import_the_examples():
    bad = {m: sorted(i for i in imps if i.startswith("driftstream.examples")) for m, imps in _graph().items()}
    assert not {m: i for m, i in bad.items() if i}
