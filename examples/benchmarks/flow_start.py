"""A flow's start to its end with new processes against warm actors that came back from the
flow before (:mod:`driftstream.engine.control.warm_actors`), interleaved in one Ray session.

    python -m driftstream.examples.benchmarks.flow_start              # 6 runs of each
    python -m driftstream.examples.benchmarks.flow_start --runs 10

The flow is small (a keyed count of 200 elements, parallelism 2, four instances), so a run's
time is its start and end: the coordinator's process and, with new processes, the instances'
and the acker's. Prints each run's seconds and the medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from driftstream.engine import Flow
from driftstream.engine.control.warm_actors import fresh_pool
from driftstream.engine.runtime.ray_session import ensure_ray
from driftstream.engine.testing import MemorySink, MemorySource, cold_start


def small_flow(name: str) -> Flow:
    flow = Flow(name)
    (flow.source(MemorySource(list(range(200)), partitions=2)).key_by(lambda x: x % 5)
         .stateful_map(lambda s, x: ((s or 0) + 1, x)).sink(MemorySink("out")))
    return flow


def measure(runs: int) -> dict:
    """``runs`` flows with new processes and ``runs`` on warm actors, alternating (seconds
    each), on the Ray session this process is connected to."""
    times: dict = {"new processes": [], "warm actors": []}
    with fresh_pool(small_flow("start-0").plan(2)):  # its own warm actors, whatever the driver had
        small_flow("start-0").run(parallelism=2)  # the warm actors' first flow: its imports
        for i in range(1, 2 * runs + 1):
            flow, cold = small_flow(f"start-{i}"), i % 2 == 1
            started = time.perf_counter()
            if cold:
                with cold_start():
                    flow.run(parallelism=2)
            else:
                flow.run(parallelism=2)
            times["new processes" if cold else "warm actors"].append(round(time.perf_counter() - started, 3))
    return {k: {"median_s": statistics.median(v), "runs_s": v} for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="runs of each kind (default 6)")
    started_ray = ensure_ray(None)
    try:
        print(json.dumps(measure(parser.parse_args().runs), indent=2))
    finally:
        if started_ray:
            import ray

            ray.shutdown()


if __name__ == "__main__":
    main()
