"""The Ray runtime: the quickstart, determinism under chaos, bounded memory, failures."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow, StepError
from driftstream.engine.testing import MemorySink, MemorySource

from tests.conftest import flow_actors
from tests.pipelines import STATE_REKEY_STATE, build
from tests.reference import reference_outputs

pytestmark = pytest.mark.ray


def concat(state, kv):  # order-sensitive: string concatenation per key
    new = (state or "") + kv[1]
    return new, new


def test_quickstart_runs_as_written(ray_session):
    flow = Flow("concat")
    docs = flow.source(MemorySource([("a", "x"), ("b", "y"), ("a", "z")], partitions=2))
    out = MemorySink("out")
    docs.key_by(lambda kv: kv[0]).stateful_map(concat).sink(out)

    result = flow.run(parallelism=3)
    assert result.output("out") == ["x", "y", "xz"]
    assert flow.run(runtime="simulator", seed=7).output("out") == ["x", "y", "xz"]
    assert result.metrics.elements["stateful_map"] == 3
    assert result.metrics.wall_time > 0
    assert flow_actors("concat/") == []


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_chaos_delays_cause_late_arrivals_but_output_is_the_reference(ray_session, parallelism):
    data = [("abcd"[i % 4], "xyzw"[(i * 7) % 4] * (1 + i % 3)) for i in range(1500)]
    flow = build(f"chaos{parallelism}", data, STATE_REKEY_STATE, partitions=4)
    expected = reference_outputs(flow)["out"]
    # At parallelism 1 a fused flow has no data plane to delay and its reader merges the
    # partitions in t order: the stage per key_by and the partitions as they come keep the chaos
    layout = {"fuse": False, "input_merge": False} if parallelism == 1 else {}
    result = flow.run(parallelism=parallelism, chaos=0.02, seed=parallelism, batch_size=16, max_inflight=400, **layout)
    assert result.output("out") == expected
    assert result.metrics.total_tombstones > 0, "chaos should have produced late arrivals"
    assert sum(result.metrics.tombstones_at_sinks.values()) == 0


def test_keyed_logs_stay_bounded_by_the_watermark(ray_session):
    n, keys, window = 200_000, 10, 2_000

    def count(c, x):
        c = (c or 0) + 1
        return c, (x % keys, c) if c % 5000 == 0 else None

    flow = Flow("bounded")
    out = MemorySink("out")
    flow.source(MemorySource(range(n), partitions=2)).key_by(lambda x: x % keys).stateful_map(count).sink(out)
    result = flow.run(parallelism=2, max_inflight=window, batch_size=500)
    outputs = result.output("out")
    assert outputs[-keys:] == [(k, n // keys) for k in range(keys)]  # the last element of each key, in t order
    assert len(outputs) == n // 5000
    # Every source instance may hold `window` unsettled elements (plus one read per partition).
    bound = 2 * (window + 2 * 500)
    peak = result.metrics.peak_log_entries
    print(f"\npeak in-memory log entries: {peak} (bound {bound}) for {n} elements over {keys} keys")
    assert 0 < peak <= bound


def test_a_raising_user_function_stops_the_run_names_step_element_and_t(ray_session):
    def explode(x):
        if x == 1234:
            raise ValueError("no 1234 here")
        return x

    flow = Flow("boom")
    flow.source(MemorySource(range(5000), partitions=2)).map(explode, name="explode").key_by(lambda x: x % 3).stateful_map(
        lambda s, x: (x, x)
    ).sink(MemorySink("out"))
    with pytest.raises(StepError) as info:
        flow.run(parallelism=2)
    err = info.value
    assert err.step == "explode"
    assert err.element == "1234"
    assert err.t[0] == 1234 and err.t[3] == 1234
    assert "ValueError: no 1234 here" in str(err)
    assert "explode" in str(err) and "1234" in str(err)
    # the user's own frame crosses from the actor's process to the driver, and what to do
    assert 'test_actors.py", line' in str(err) and 'raise ValueError("no 1234 here")' in str(err)
    assert 'on_error="dead-letter"' in str(err) and "--runtime simulator --seed" in str(err)
    assert flow_actors("boom/") == []


def test_a_raising_stateful_function_is_reported_with_its_element(ray_session):
    def bad_state(state, x):
        return (state or 0) + x["n"], None  # ints have no ["n"]

    flow = Flow("badstate")
    flow.source(MemorySource([1, 2, 3])).key_by(lambda x: "k").stateful_map(bad_state, name="sum").sink(MemorySink("out"))
    with pytest.raises(StepError, match=r"step 'sum' failed on element value 1 \(source 0, partition 0, offset 0\): TypeError") as info:
        flow.run(parallelism=1)
    assert "TypeError" in info.value.cause
    assert "return (state or 0) + x[\"n\"], None" in str(info.value)  # the user's line, through the C path
    assert flow_actors("badstate/") == []


class _UnreadableSource(MemorySource):
    """Reads its first elements, then fails as a source that cannot read on does (a Kafka
    batch in a codec whose library is missing, a broker gone for its broker_timeout_s).
    Each partition it opens is noted in ``opened`` (a file: the actors are processes)."""

    def __init__(self, items, partitions: int, opened: str) -> None:
        super().__init__(items, partitions=partitions)
        self.opened = opened

    def open(self, partition, source_id, start=None):
        with open(self.opened, "a") as fh:
            fh.write(f"{partition}\n")
        part = super().open(partition, source_id, start)
        read = part.read

        def failing_read(max_items):
            if part.position()[0] >= 10:
                raise OSError(f"partition {partition} cannot be read on")
            return read(max_items)

        part.read = failing_read
        return part


def test_a_source_that_cannot_read_on_fails_the_run_at_once(ray_session, tmp_path):
    """Not a recovery: a replay would fail the same way, again and again."""
    opened = tmp_path / "opened"
    flow = Flow("unreadable")
    flow.source(_UnreadableSource(range(100), 2, str(opened))).key_by(lambda x: x % 2).stateful_map(lambda s, x: (x, x)).sink(MemorySink("out"))
    with pytest.raises(OSError, match="cannot be read on"):
        flow.run(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, batch_size=4, snapshot_dir=str(tmp_path / "snaps"))
    assert sorted(opened.read_text().split()) == ["0", "1"]  # each partition opened once: no recovery
    assert flow_actors("unreadable/") == []


def test_a_fused_flow_snapshots_while_its_source_drains_a_backlog(ray_session, tmp_path):
    """At parallelism 1 the source's reads run the whole flow (fused): the snapshot writer's
    turns must match them, as they match the batches of an unfused keyed stage. With 1 ms
    turns behind each read of ~100 ms, a base never completed within a backlog: no snapshot."""
    from driftstream.examples.benchmarks.backlog import documents
    from driftstream.examples.inverted_index.pipeline import build as index_flow

    flow = index_flow(MemorySource(documents(8000), partitions=2), MemorySink("changes"), name="fused-snapshots")
    assert len(flow.plan(1).stages) == 1  # fused
    result = flow.run(parallelism=1, guarantee="exactly-once", snapshot_interval=0.3, snapshot_dir=str(tmp_path / "snaps"))
    assert result.output("changes")
    assert result.metrics.snapshots >= 3, (result.metrics.snapshots, result.metrics.wall_time)
