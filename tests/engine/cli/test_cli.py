"""The console command: run, plan, and errors that say what to fix."""

from __future__ import annotations

import pytest

from driftstream.engine import FlowError
from driftstream.engine.cli.main import main


def test_plan_lists_stages_and_actor_names(capsys):
    assert main(["plan", "tests.engine.cli.small_flow:flow", "--parallelism", "2"]) == 0
    out = capsys.readouterr().out
    assert "stage key_by: key_by -> stateful_map -> counts" in out
    assert "cli-small/key_by/0, cli-small/key_by/1" in out


@pytest.mark.ray
def test_run_prints_released_output_in_t_order(ray_session, capsys):
    assert main(["run", "tests.engine.cli.small_flow:flow", "--parallelism", "2"]) == 0
    out = capsys.readouterr().out
    assert "sink counts: 3 elements released" in out
    assert out.index("'b=1'") < out.index("'a=1'") < out.index("'a=2'")


FILE_FLOW = """
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource

def shout(word):  # a function of this file: the actors cannot import the file, it travels by value
    return word.upper() + "!"

flow = Flow("cli-file")
flow.source(MemorySource(["a", "b"], partitions=2)).map(shout).sink(MemorySink("loud"))
"""


@pytest.mark.ray
def test_run_takes_a_file_path(ray_session, tmp_path, capsys):
    path = tmp_path / "my-flow.py"
    path.write_text(FILE_FLOW)
    assert main(["run", f"{path}:flow"]) == 0
    out = capsys.readouterr().out
    assert "sink loud: 2 elements released" in out and "'A!'" in out and "'B!'" in out


def test_a_file_path_runs_on_the_simulator_and_a_missing_file_says_so(tmp_path, capsys):
    path = tmp_path / "flow_file.py"
    path.write_text(FILE_FLOW)
    assert main(["run", f"{path}:flow", "--runtime", "simulator"]) == 0
    assert "'A!'" in capsys.readouterr().out
    assert main(["run", f"{tmp_path}/nope.py:flow"]) == 2
    err = capsys.readouterr().err
    assert f"no file '{tmp_path}/nope.py' to load a flow from" in err and "Traceback" not in err


def test_simulator_runtime_from_the_cli(capsys):
    assert main(["run", "tests.engine.cli.small_flow:flow", "--runtime", "simulator", "--seed", "3"]) == 0
    assert "'a=2'" in capsys.readouterr().out


def test_invalid_flows_exit_2_with_the_fix(capsys):
    assert main(["run", "tests.engine.cli.small_flow:no_sink"]) == 2
    assert "has no sink" in capsys.readouterr().err
    assert main(["run", "tests.engine.cli.small_flow:missing"]) == 2
    assert "no flow 'missing' in module 'tests.engine.cli.small_flow'" in capsys.readouterr().err
    # A module that is not there: one line that says so, not an import traceback.
    assert main(["run", "tests.engine.cli.no_such_module:flow"]) == 2
    err = capsys.readouterr().err
    assert "no module 'tests.engine.cli.no_such_module' to load flow 'flow' from" in err and "Traceback" not in err


def test_bench_and_demo_come_from_the_examples_through_entry_points():
    from driftstream.engine.cli.main import plugin_command
    from driftstream.examples.benchmarks import bench

    assert plugin_command("bench") is bench.main and plugin_command("demo") is bench.demo
    with pytest.raises(FlowError, match="no command 'nonesuch' is installed"):
        plugin_command("nonesuch")
