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
        ({"snapshot_dri": "/tmp/x"}, "unknown run option 'snapshot_dri'; did you mean 'snapshot_dir'\\? the options are: "),
        ({"zzz": 1}, "unknown run option 'zzz'; the options are: allow_new_partitions, "),
    ],
)
def test_bad_options_fail_with_what_to_write(options, message):
    with pytest.raises(FlowError, match=message):
        RunConfig.from_options(**options)


def test_an_unknown_option_lists_the_users_options_not_the_engines_hooks():
    with pytest.raises(FlowError) as info:
        RunConfig.from_options(paralelism=2)
    listed = str(info.value).split("the options are: ")[1].split(", ")
    assert "snapshot_dir" in listed and "faults" not in listed and "keep_parallelism" not in listed
    assert RunConfig.from_options(faults={"after_restore": ["a"]}).faults == {"after_restore": ("a",)}  # still taken


def test_the_simulator_refuses_what_it_cannot_honour():
    flow = Flow("sim-refuses")
    flow.source(MemorySource([1, 2])).map(abs).sink(MemorySink("out"))
    with pytest.raises(FlowError, match="the simulator cannot honour chaos, resume: .*runtime='ray'"):
        flow.run(runtime="simulator", guarantee="exactly-once", chaos=0.01, resume=True)
    assert flow.run(runtime="simulator", seed=3, batch_size=2).output("out") == [1, 2]


def test_run_options_are_runconfigs_public_fields_with_the_types_it_accepts():
    import dataclasses
    import typing

    from driftstream.engine.model.config import INTERNAL_OPTIONS, RunOptions
    from driftstream.engine.model.data_plane import DataPlaneTLS

    options, fields = typing.get_type_hints(RunOptions), typing.get_type_hints(RunConfig)
    public = {f.name for f in dataclasses.fields(RunConfig)} - INTERNAL_OPTIONS
    assert set(options) == public and not INTERNAL_OPTIONS & set(options)  # the test hooks stay out
    wider = {name for name in public if options[name] != fields[name]}
    assert wider == {"guarantee", "data_plane_tls"}  # RunConfig takes these as names / dicts too
    assert Guarantee in typing.get_args(options["guarantee"]) and DataPlaneTLS in typing.get_args(options["data_plane_tls"])


def test_flow_run_and_start_take_their_options_by_keyword_only_typed_as_run_options():
    import inspect

    for method in (Flow.run, Flow.start):
        params = inspect.signature(method).parameters
        assert params["options"].kind is inspect.Parameter.VAR_KEYWORD and params["options"].annotation == "Unpack[RunOptions]"
        assert params["address"].kind is inspect.Parameter.KEYWORD_ONLY
    flow = Flow("kw")
    flow.source(MemorySource([1, 2])).sink(MemorySink("out"))
    with pytest.raises(TypeError):
        flow.run(1, "simulator", 3)  # a seed (or an address) given by position
    with pytest.raises(FlowError, match="did you mean 'snapshot_interval'"):
        flow.run(runtime="simulator", snapshot_intervall=2)
