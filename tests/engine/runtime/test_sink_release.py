"""SinkRelease: one bundle in flight per sink, durability below the watermark a bundle was
released at, and snapshot parts that wait for the output below their time."""

from __future__ import annotations

import pytest

from driftstream.barriers.barrier import Barrier
from driftstream.engine.connectors.memory import MemorySink
from driftstream.engine.model.errors import StepError
from driftstream.engine.runtime.sink_release import SinkRelease
from driftstream.ordering.meta import BOTTOM, TOP, Meta


def deferred(n_sinks: int = 1):
    """A SinkRelease whose writes wait until the test completes them (as the Ray runtime's
    writer threads do), with the bundles handed out."""
    barriers = {sid: (Barrier(), MemorySink(f"s{sid}").open(0, 1)) for sid in range(n_sinks)}
    handed: list = []
    sinks = SinkRelease(barriers, write_bundle=lambda sid, sink, bundle: handed.append((sid, sink, bundle)), step_name=lambda sid: f"s{sid}")
    return sinks, barriers, handed


def complete(sinks: SinkRelease, handed: list) -> None:
    sid, sink, bundle = handed.pop(0)
    sink.write(bundle)
    sinks.bundle_written(sid, bundle)


def test_one_bundle_in_flight_and_what_settles_meanwhile_leaves_in_the_next():
    sinks, barriers, handed = deferred()
    barrier = barriers[0][0]
    barrier.add(Meta(1, 0, 0, 1), "a")
    sinks.release_all((2,))
    barrier.add(Meta(2, 0, 0, 2), "b")
    sinks.release_all((3,))  # "b" settled, but "a"'s bundle is not acknowledged yet
    assert [[p for _, p in b.elements] for _, _, b in handed] == [["a"]]
    assert sinks.output_durable_through() == BOTTOM
    complete(sinks, handed)  # acknowledged: "b" leaves at once, in the next bundle
    assert [[p for _, p in b.elements] for _, _, b in handed] == [["b"]]
    assert sinks.output_durable_through() == (2,)
    complete(sinks, handed)
    assert sinks.output_durable_through() == (3,) and sinks.released_total() == 2
    assert [p for _, p in sinks.collected()["s0"]] == ["a", "b"]


def test_a_part_waits_until_every_sink_holds_the_output_below_its_time():
    sinks, barriers, handed = deferred(2)
    barriers[0][0].add(Meta(1, 0, 0, 1), "a")
    sinks.part_prepared((5,), "part 5")
    sinks.release_all((5,))
    assert sinks.ready_parts() == []  # sink 1 is durable through (5,), sink 0's bundle is in flight
    complete(sinks, handed)
    assert sinks.ready_parts() == ["part 5"] and sinks.ready_parts() == []


def test_without_sinks_everything_is_durable():
    sinks = SinkRelease({})
    sinks.part_prepared((1,), "p")
    assert sinks.output_durable_through() == TOP and sinks.ready_parts() == ["p"] and sinks.t_last() is None


def test_a_failed_write_is_a_step_error_naming_the_sink():
    sinks, barriers, handed = deferred()
    barriers[0][0].add(Meta(1, 0, 0, 1), "a")
    sinks.release_all((2,))
    _, _, bundle = handed.pop()
    with pytest.raises(StepError, match="s0"):
        sinks.bundle_written(0, bundle, OSError("broker gone"))
