"""verify="reexecute:N" on Ray: a value flipped in a stateful instance's settled state (of a key
at rest: a flip in a key's log that the watermark folds before a re-run re-applies it is not
caught, see docs/architecture.md), or its function computing wrong once, mid-run under
exactly-once: the instance catches it before any output derived from it leaves, exits, and the
run rolls back; the output is the fault-free run's, element for element."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.testing import MemorySource, PacedSource, fault_at

from tests.engine.control.test_exactly_once import N, checksum

pytestmark = pytest.mark.ray


def by_key(x):
    return x[0]


def build(name: str, sink, paced: bool) -> Flow:
    """Six keys (five of them instance 0's at parallelism 2), each in turn for 200 elements (a key
    rests between its turns, its log folded), through an order-sensitive running checksum."""
    items = [("k%d" % (10 + (i // 200) % 6), i) for i in range(N)]
    source = PacedSource(items, rate=3000, partitions=3) if paced else MemorySource(items, partitions=3)
    flow = Flow(name)
    flow.source(source, name="src").key_by(by_key, name="by_key").stateful_map(checksum, name="sum").sink(sink)
    return flow


@pytest.mark.parametrize("kind,where", [("flip at rest", "process"), ("wrong", "process"), ("flip at rest", "verifier"),
                                        ("wrong", "verifier")])
def test_a_fault_in_keyed_state_is_caught_and_the_output_is_the_fault_free_one(ray_session, tmp_path, kind, where):
    """A wrong result re-run on the verifier (``where``) is caught only there: the instance
    re-runs nothing itself, and the settled reads it checks do not see a wrong value written.
    Its output reached the sink's writer before the verdict: held there until it came."""
    build("rx-ref", FileSink(tmp_path / "ref", name="out"), paced=False).run(parallelism=2)
    expected = read_file_sink(tmp_path / "ref", "out")
    name = f"rx-{kind.split()[0]}-{where}"
    out = tmp_path / name
    injector = fault_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, f"{name}/by_key/0", N // 6, kind, seed=3)
    flow = build(name, FileSink(out, name="out"), paced=True)
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                      verify="reexecute:1", reexecute_on=where)
    injector.join(timeout=5)
    assert not injector.errors and injector.faults, injector.errors
    assert result.metrics.recoveries == 1, result.metrics.recovery_s  # the corruption was caught: the instance exited
    assert read_file_sink(out, "out") == expected
