"""A paced exactly-once flow for the driver-kill test; run as a script it is the driver to kill.

    python -m tests.engine.api.resume_flow RAY_ADDRESS OUT_DIR SNAPSHOT_DIR
"""

from __future__ import annotations

import sys

from driftstream.engine.connectors.file_sink import FileSink
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySource, PacedSource

N = 8000


def rolling(state, x):
    new = ((state or 0) * 31 + x) % 1_000_003
    return new, [x % 5, x, new]


def build(out_dir: str, paced: bool = True, rate: float = 2000) -> Flow:
    items = list(range(N))
    source = PacedSource(items, rate=rate, partitions=2) if paced else MemorySource(items, partitions=2)
    flow = Flow("resume")
    flow.source(source, name="numbers").key_by(lambda x: x % 5, name="by_mod").stateful_map(rolling, name="roll").sink(
        FileSink(out_dir, name="out")
    )
    return flow


def failure_free_output(tmp_path_factory) -> list:
    """What a resumed or recovered run of ``build``'s flow must equal (a failure-free run on
    Ray, parallelism 2; once per session, see tests/reference.py). It runs a flow named
    "resume": call it while no other one runs."""
    from tests.reference import failure_free_output as once

    return once("resume", tmp_path_factory, lambda out: build(str(out), paced=False).run(parallelism=2))


if __name__ == "__main__":
    address, out_dir, snapshot_dir = sys.argv[1:4]
    build(out_dir).run(parallelism=2, address=address, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=snapshot_dir)
