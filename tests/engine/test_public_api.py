"""What ``driftstream.engine`` exports: what a user names to define, run and extend a flow,
without reaching into the engine's rooms; importing it does not import Ray."""

from __future__ import annotations

import subprocess
import sys

import driftstream.engine as engine


def test_the_types_a_user_names_are_exported():
    from driftstream.engine.model.config import Guarantee, RunConfig
    from driftstream.engine.model.connectors import Sink, SinkPartition
    from driftstream.engine.model.errors import DeadLetter

    for name, cls in {"Sink": Sink, "SinkPartition": SinkPartition, "DeadLetter": DeadLetter, "RunConfig": RunConfig,
                      "Guarantee": Guarantee}.items():
        assert name in engine.__all__ and getattr(engine, name) is cls
    assert all(hasattr(engine, name) for name in engine.__all__)


def test_importing_the_api_does_not_import_ray():
    code = "import sys, driftstream.engine; from driftstream.engine import RunConfig, Flow; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
