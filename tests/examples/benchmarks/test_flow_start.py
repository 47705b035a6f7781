"""The flow-start benchmark: it times both kinds of start, and its warm runs leave the session's
pool as they found it."""

from __future__ import annotations

from driftstream.engine.control.warm_actors import warm_pool
from driftstream.examples.benchmarks.flow_start import measure


def test_it_times_new_processes_and_warm_actors_and_gives_the_pool_back(ray_session):
    pool = sorted(warm_pool().names())
    figures = measure(runs=1)
    assert set(figures) == {"new processes", "warm actors"}
    assert all(len(f["runs_s"]) == 1 and f["median_s"] > 0 for f in figures.values())
    assert sorted(warm_pool().names()) == pool  # the session's warm actors, as they were
