"""RunConfig: every option validated once, in the driver, with a message that says the fix."""

from __future__ import annotations

import pytest

from driftstream.engine import Flow, FlowError
from driftstream.engine.model.config import Guarantee, RunConfig
from driftstream.engine.testing import MemorySink, MemorySource


def test_guarantee_is_an_enum_that_compares_to_its_name():
    config = RunConfig.from_options(guarantee="at-least-once")
    assert config.guarantee is Guarantee.AT_LEAST_ONCE and config.guarantee == "at-least-once"
    assert config.takes_snapshots and not RunConfig().takes_snapshots
    assert config.resumed().resume and not config.resume


@pytest.mark.parametrize(
    "options, message",
    [
        ({"guarantee": "exactly_once"}, "guarantee must be one of exactly-once"),
        ({"snapshot_interval": 0}, "snapshot_interval is a positive number"),
        ({"batch_size": 0}, "batch_size is a positive int"),
        ({"coordinator_niceness": 25}, "coordinator_niceness is an int from 0"),
        ({"snapshot_dri": "/tmp/x"}, "unknown run option 'snapshot_dri'; the options are: "),
    ],
)
def test_bad_options_fail_with_what_to_write(options, message):
    with pytest.raises(FlowError, match=message):
        RunConfig.from_options(**options)


def test_the_simulator_refuses_what_it_cannot_honour():
    flow = Flow("sim-refuses")
    flow.source(MemorySource([1, 2])).map(abs).sink(MemorySink("out"))
    with pytest.raises(FlowError, match="the simulator cannot honour chaos, resume: .*runtime='ray'"):
        flow.run(runtime="simulator", guarantee="exactly-once", chaos=0.01, resume=True)
    assert flow.run(runtime="simulator", seed=3, batch_size=2).output("out") == [1, 2]
