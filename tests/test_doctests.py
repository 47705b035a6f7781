"""The examples in the docstrings run and are right: doctest every module of the installed
driftstream packages and their subpackages, examples included (one test per
module; the Ray runtime and the CLI are left out: they need Ray or a terminal)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["driftstream.ordering", "driftstream.barriers", "driftstream.snapshots", "driftstream.engine", "driftstream.examples"]
SKIP = {"driftstream.engine.runtime.actors", "driftstream.engine.cli.main"}


def _modules() -> list:
    names = []
    for package in PACKAGES:
        names.append(package)
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
            if info.name not in SKIP:
                names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_every_package_has_modules():
    for package in PACKAGES:
        assert any(m.startswith(package + ".") for m in MODULES), package
    assert "driftstream.ordering.meta" in MODULES and "driftstream.barriers.barrier" in MODULES
    assert "driftstream.engine.connectors.kafka.wire" in MODULES and "driftstream.examples.benchmarks.soak" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in {name} (see the output above)"
