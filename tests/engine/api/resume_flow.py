"""A paced exactly-once flow for the driver-kill test; run as a script it is the driver to kill.

    python -m tests.engine.api.resume_flow RAY_ADDRESS OUT_DIR SNAPSHOT_DIR
"""

from __future__ import annotations

import sys

from driftstream.barriers.file_sink import FileSink
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySource, PacedSource

N = 8000


def rolling(state, x):
    new = ((state or 0) * 31 + x) % 1_000_003
    return new, [x % 5, x, new]


def build(out_dir: str, paced: bool = True) -> Flow:
    items = list(range(N))
    source = PacedSource(items, rate=2000, partitions=2) if paced else MemorySource(items, partitions=2)
    flow = Flow("resume")
    flow.source(source, name="numbers").key_by(lambda x: x % 5, name="by_mod").stateful_map(rolling, name="roll").sink(
        FileSink(out_dir, name="out")
    )
    return flow


#: the failure-free output of ``build``'s flow, once per session (see failure_free_output)
_FAILURE_FREE: list = []


def failure_free_output(tmp_path_factory) -> list:
    """The FileSink content (payloads and Metas) of a failure-free run of ``build``'s flow on
    Ray (MemorySource, parallelism 2), what a resumed or recovered run must equal. It depends
    on the flow alone, so one run serves every test of the session that compares with it.
    (Runs a flow named "resume": call it while no other one runs.)"""
    if not _FAILURE_FREE:
        from driftstream.barriers.file_sink import read_file_sink

        out = tmp_path_factory.mktemp("resume-ref")
        build(str(out), paced=False).run(parallelism=2)
        _FAILURE_FREE.append(read_file_sink(out, "out"))
    return list(_FAILURE_FREE[0])


if __name__ == "__main__":
    address, out_dir, snapshot_dir = sys.argv[1:4]
    build(out_dir).run(parallelism=2, address=address, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=snapshot_dir)
