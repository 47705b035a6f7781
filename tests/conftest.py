"""Shared fixtures: one lean local Ray session per test run; the test tiers.

Tiers: every test that takes the Ray session is marked ``ray``; ``slow`` marks those, the
Spark, Flink and benchmark harnesses (``tests/examples``, ``tests/benchmarks``), and tests
marked ``slow`` by hand. ``pytest -m "not slow"`` is the fast tier: every module through
the simulator and the real broker, in a few minutes; ``pytest`` runs everything.

Two processes run the tests (pytest-xdist, ``-n 2`` in pyproject.toml): the tests on Ray are
one unit of work, which one process runs in order on the one Ray session, while the other takes
the simulator's, the broker's and the baselines' tests. ``-n 0`` runs them in one
process (and lets pytest-benchmark time its benchmarks, which it does not do under xdist)."""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

import pytest

from driftstream.engine.runtime.ray_session import LEAN_RAY_ENV

for _k, _v in LEAN_RAY_ENV.items():
    os.environ.setdefault(_k, _v)


#: test directories whose tests run whole engines (Spark, Flink, benchmarks): slow
SLOW_DIRS = ("tests/examples/", "tests/benchmarks/")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    root = str(config.rootpath) + os.sep
    on_ray = ray_tests(config.rootpath)
    for item in items:
        path = str(item.path).removeprefix(root)
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("ray") and item.nodeid.split("[", 1)[0] not in on_ray:
            raise pytest.UsageError(f"{item.nodeid} runs on Ray, which tests/conftest.py's ray_tests did not see in its "
                                    "source: take ray_session or mark it (or its class or module) pytest.mark.ray there")
        if item.get_closest_marker("ray") or path.startswith(SLOW_DIRS):
            item.add_marker(pytest.mark.slow)


#: the scheduler's unit of work that holds every test on Ray (see below)
RAY_GROUP = "ray"


@functools.lru_cache(maxsize=None)
def ray_tests(root: Path) -> frozenset:
    """The tests under ``root``/tests that run on the Ray session, by their source: as node ids
    without parameters (``tests/x/test_y.py::test_z``, ``...::TestC::test_z``), found by
    ``pytestmark``, the ``ray`` marker on the test or its class, or the ``ray_session`` fixture
    (taken directly or through fixtures of the same file). The collection checks the answer
    (:func:`pytest_collection_modifyitems`)."""
    found: set = set()
    mark = re.compile(r"mark\.ray\b")
    for path in sorted((root / "tests").rglob("test_*.py")):
        source = path.read_text()
        if not re.search(r"ray_session|mark\.ray\b", source):
            continue
        tree = ast.parse(source)
        file = str(path.relative_to(root))
        whole = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                    and mark.search(ast.unparse(n.value)) for n in tree.body)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        on_ray = {"ray_session"}  # and the fixtures that take it
        while True:
            more = {f.name for f in functions if f.name not in on_ray and any(a.arg in on_ray for a in f.args.args)}
            if not more:
                break
            on_ray |= more
        for node in tree.body:
            owner = node if isinstance(node, ast.ClassDef) else None
            for f in (node.body if owner is not None else [node]):
                if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) or not f.name.startswith("test"):
                    continue
                decorators = f.decorator_list + (owner.decorator_list if owner is not None else [])
                if whole or any(mark.search(ast.unparse(d)) for d in decorators) or any(a.arg in on_ray for a in f.args.args):
                    found.add(f"{file}::{owner.name}::{f.name}" if owner is not None else f"{file}::{f.name}")
    return frozenset(found)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``-n N`` (xdist's "load"): every test on Ray is in one unit of work, the largest,
    which one process takes first and runs in order on its one Ray session; every other test is
    a unit of its own, for whichever process is free. (xdist's ``loadgroup`` would group by
    marker, but under pytest 9.2 the group it appends to a test's id does not reach the scheduler.)"""
    if config.getvalue("dist") != "load":
        return None  # the caller chose another distribution
    from xdist.scheduler import LoadScopeScheduling

    on_ray = ray_tests(config.rootpath)

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return RAY_GROUP if nodeid.split("[", 1)[0] in on_ray else nodeid

    return RayTestsTogether(config, log)


@pytest.fixture(autouse=True)
def _ray_only_when_marked(request, monkeypatch):
    """A test that starts Ray must say so (the ``ray_session`` fixture or ``@pytest.mark.ray``):
    otherwise ``ray.init`` fails it, so the fast tier (``-m "not slow"``) never starts Ray."""
    if request.node.get_closest_marker("ray") is None:
        import ray

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts Ray without the ray_session fixture or @pytest.mark.ray")

        monkeypatch.setattr(ray, "init", refuse)
    yield


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one, with warm actors (each flow's
    start takes them instead of starting processes, and they come back when it ends: see
    ``engine/control/warm_actors.py``; ``engine.testing.cold_start`` sets them aside for a
    test of the cold path); shut down at the end."""
    import ray

    from driftstream.engine import warm_up
    from driftstream.engine.control.warm_actors import end_warm

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="driftstream", configure_logging=False)
    warm_up(stage_actors=WARM_STAGE_ACTORS, ackers=1)
    yield ray
    end_warm()
    ray.shutdown()


#: The session's warm stage actors: the instances of most test flows (up to four stages at parallelism 2, two at 4).
WARM_STAGE_ACTORS = 8


def flow_actors(prefix: str) -> list:
    """Names of live driftstream actors whose name starts with ``prefix``."""
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


@pytest.fixture(scope="session")
def kafka_broker():
    """One local Tansu broker for the whole test run (real Kafka protocol, in-memory storage)."""
    from driftstream.engine.connectors.local_kafka import start_local_kafka

    broker = start_local_kafka()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres():
    """One local PostgreSQL server for the whole test run (initdb and pg_ctl, a temporary directory)."""
    from driftstream.engine.connectors.local_postgres import start_local_postgres

    pg = start_local_postgres()
    yield pg
    pg.stop()
