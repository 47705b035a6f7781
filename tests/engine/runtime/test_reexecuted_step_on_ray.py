"""verify="reexecute:N" on Ray: a value flipped in a stateful instance's settled state, or its
function computing wrong once, mid-run under exactly-once: the instance catches it before any
output derived from it leaves, exits, and the run rolls back; the output is the fault-free
run's, element for element."""

from __future__ import annotations

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.testing import fault_at

from tests.engine.control.test_exactly_once import N, build, failure_free_output

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("kind", ["flip", "wrong"])
def test_a_fault_in_keyed_state_is_caught_and_the_output_is_the_fault_free_one(ray_session, tmp_path, tmp_path_factory, kind):
    expected = failure_free_output(tmp_path_factory)
    name = f"rx-{kind}"
    out = tmp_path / name
    injector = fault_at(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, f"{name}/by_key/0", N // 3, kind, seed=3)
    flow = build(name, FileSink(out, name="out"), paced=True)
    result = flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
                      verify="reexecute:1")
    injector.join(timeout=5)
    assert not injector.errors and injector.faults, injector.errors
    assert result.metrics.recoveries == 1, result.metrics.recovery_s  # the corruption was caught: the instance exited
    assert read_file_sink(out, "out") == expected
