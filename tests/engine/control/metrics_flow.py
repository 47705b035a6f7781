"""A paced flow with keyed state, dead letters and wall-clock times, for the tests of live
status and of the metrics export; run as a script it is the exactly-once driver on a
cluster, until stdin closes.

    python -m tests.engine.control.metrics_flow SNAPSHOT_DIR   # with RAY_ADDRESS set
"""

from __future__ import annotations

import os
import sys
import time

from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, PacedSource

NAME = "metrics-export"
RATE = 100.0
#: every POISON-th element makes the checked step raise: a dead letter
POISON = 50


class WallClockSource(PacedSource):
    """Paced input whose times are wall-clock timestamps (as Kafka's records have)."""

    epoch_ms_times = True


def seconds(x: float) -> float:
    return x


def checked(x: float) -> float:
    if round(x * RATE) % POISON == 0:
        raise ValueError(f"poison {x}")
    return x


def slot(x: float) -> int:
    # An odd number of keys over 2 partitions: each key gets elements of both, which chaos
    # delays can take out of order.
    return round(x * RATE) % 3


def last_two(state, x):
    return x, (state, x)


def build(name: str = NAME, n: int = 100_000) -> Flow:
    t0 = time.time()
    flow = Flow(name).dead_letters(MemorySink("dlq"))
    source = WallClockSource([t0 + i / RATE for i in range(n)], rate=RATE, partitions=2, timestamp=seconds)
    (flow.source(source, name="readings").map(checked, name="checked", on_error="dead-letter")
     .key_by(slot, name="by_slot").stateful_map(last_two, name="pairs").sink(MemorySink("out")))
    return flow


if __name__ == "__main__":
    handle = build().start(parallelism=2, address=os.environ["RAY_ADDRESS"], guarantee="exactly-once", snapshot_interval=0.3,
                           snapshot_dir=sys.argv[1], metrics_interval=0.5)
    sys.stdin.read()  # the test closes it once it has seen the metrics
    handle.stop(timeout=60)
