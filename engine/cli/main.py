"""The ``driftstream`` console command.

    driftstream run package.module:flow | path/file.py:flow [--parallelism N] [--address HOST:PORT] [--runtime ray|simulator]
    driftstream plan package.module:flow [--parallelism N]
    driftstream demo                  # the inverted index, exactly-once at 50 docs/s, checked against PySpark
    driftstream bench wordcount [--rate N] ...
    driftstream bench inverted-index  # driftstream vs Spark Structured Streaming
    driftstream kafka start|stop
    driftstream start package.module:flow [-p N] [--guarantee G] [--snapshot-dir DIR] [--resume]   # detached, on a cluster
    driftstream list | status NAME [--watch] | rescale NAME -p N | stop NAME
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Callable, Optional

from driftstream.engine.model.errors import FlowError, StepError
from driftstream.engine.api.flow import Flow
from driftstream.engine.cli.flows import add_commands


def load_flow(spec: str) -> Flow:
    """``package.module:attribute`` or ``path/to/file.py:attribute`` -> the Flow it names (a
    Flow, or a function returning one)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise FlowError(f"expected package.module:flow or path/to/file.py:flow, got {spec!r}")
    module = _file_module(module_name) if module_name.endswith(".py") or os.sep in module_name else _module(module_name, attr)
    obj = getattr(module, attr, None)
    if obj is None:
        raise FlowError(f"no flow {attr!r} in module {module_name!r} ({module.__file__})")
    if callable(obj) and not isinstance(obj, Flow):
        obj = obj()
    if not isinstance(obj, Flow):
        raise FlowError(f"{spec} is a {type(obj).__name__}, not a driftstream Flow")
    return obj


def _module(module_name: str, attr: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the module exists; something it imports does not: its own traceback says what
        raise FlowError(f"no module {module_name!r} to load flow {attr!r} from: check the spelling, and that it is "
                        "importable here (installed, or under the current directory or PYTHONPATH)") from None


def _file_module(path: str) -> ModuleType:
    """The module of a flow file. Its functions travel to the actors by value (Ray's workers
    could not import a file by its path), as a notebook's do."""
    if not os.path.isfile(path):
        raise FlowError(f"no file {path!r} to load a flow from (paths are relative to {os.getcwd()})")
    name = "driftstream_flow_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _run(args: argparse.Namespace) -> int:
    flow = load_flow(args.flow)
    print(flow.plan(args.parallelism).describe())
    result = flow.run(parallelism=args.parallelism, runtime=args.runtime, address=args.address, seed=args.seed)
    for name, elements in result.outputs.items():
        print(f"sink {name}: {len(elements)} elements released; last {min(args.show, len(elements))}:")
        for _, payload in elements[len(elements) - min(args.show, len(elements)) :]:
            print(f"  {payload!r}")
    print(result.metrics.summary())
    return 0


def _plan(args: argparse.Namespace) -> int:
    print(load_flow(args.flow).plan(args.parallelism).describe())
    return 0


#: Entry-point group through which installed packages add commands (``driftstream bench``,
#: ``driftstream demo``: the benchmark harnesses in ``driftstream.examples``), so the engine
#: does not import its examples.
COMMANDS_GROUP = "driftstream.commands"


def plugin_command(name: str) -> Callable[[list], int]:
    """The function registered as command ``name`` in :data:`COMMANDS_GROUP`."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=COMMANDS_GROUP):
        if ep.name == name:
            return ep.load()
    raise FlowError(f"no command {name!r} is installed: it comes with the examples, install driftstream with pip install -e '.[bench]'")


def _plugin(args: argparse.Namespace) -> int:
    return plugin_command(args.command)(args.rest)


def _kafka(args: argparse.Namespace) -> int:
    from driftstream.engine.connectors.local_kafka import cli_start, cli_stop

    if args.action == "start":
        print(cli_start(args.port))
    else:
        print("stopped" if cli_stop() else "no local broker was running")
    return 0


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream", description="deterministic stream processing on Ray")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a flow defined in a module to the end")
    run.add_argument("flow", help="package.module:flow")
    run.add_argument("--parallelism", "-p", type=int, default=1)
    run.add_argument("--address", default=None, help="Ray cluster address (default: start Ray locally)")
    run.add_argument("--runtime", choices=["ray", "simulator"], default="ray")
    run.add_argument("--seed", type=int, default=None, help="simulator seed")
    run.add_argument("--show", type=int, default=5, help="how many of the last released elements to print per sink")
    run.set_defaults(fn=_run)
    plan = sub.add_parser("plan", help="show stages, steps and actor names")
    plan.add_argument("flow")
    plan.add_argument("--parallelism", "-p", type=int, default=1)
    plan.set_defaults(fn=_plan)
    kafka = sub.add_parser("kafka", help="start or stop the local Kafka-protocol broker (Tansu)")
    kafka.add_argument("action", choices=["start", "stop"])
    kafka.add_argument("--port", type=int, default=None)
    kafka.set_defaults(fn=_kafka)
    add_commands(sub, load_flow)
    bench = sub.add_parser("bench", help="benchmarks (driftstream bench wordcount --help)", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(fn=_plugin)
    demo = sub.add_parser(
        "demo", help="inverted index over Wikipedia: exactly-once at 50 docs/s for a minute, checked against PySpark", add_help=False
    )
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    demo.set_defaults(fn=_plugin)
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in ("bench", "demo"):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        args.rest = unknown + args.rest
    sys.path.insert(0, "")  # let `driftstream run mymodule:flow` find modules in the current directory
    try:
        return args.fn(args)
    except (FlowError, StepError) as exc:
        print(f"driftstream: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
