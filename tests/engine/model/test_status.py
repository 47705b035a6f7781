"""FlowStatus: status() as one typed record whose dict has the keys users, the CLI's status
view and the metrics export read."""

from __future__ import annotations

from driftstream.engine.model.status import FlowStatus

#: the keys status() returned as a hand-built dict (before FlowStatus), and the run counts' note
KEYS = {
    "steps", "latency_ms", "watermark_lag_s", "unavailable", "watermark", "in_flight", "emitted", "released", "dead_letters",
    "step_dead_letters", "source_lag", "source_partitions", "source_behind", "skipped", "state_cache", "late_elements",
    "last_snapshot", "snapshots", "snapshot_failures", "last_snapshot_error", "snapshots_failing_s", "recoveries",
    "commit_groups", "parallelism", "max_parallelism", "rescales", "corrupt_snapshots", "key_groups", "counted_since_snapshot",
    "dissents", "reexecution",
}


def test_the_dict_has_every_key_and_the_latency_samples_only_when_asked():
    assert set(FlowStatus().to_dict()) == KEYS
    assert FlowStatus(latency_samples_ms=[1.0]).to_dict()["latency_samples_ms"] == [1.0]


def test_the_dict_is_a_copy_of_the_fields_not_of_their_values():
    steps = {"out": {"elements": 3, "tombstones": 0}}
    d = FlowStatus(steps=steps, watermark=(1, 0, 0, 1)).to_dict()
    assert d["steps"] is steps and d["watermark"] == (1, 0, 0, 1)
