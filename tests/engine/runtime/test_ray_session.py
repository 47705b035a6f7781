"""The local Ray session a run starts: quiet about what it does by default."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

QUIET_RUN = textwrap.dedent("""
    from driftstream.engine import Flow
    from driftstream.engine.testing import MemorySink, MemorySource
    flow = Flow("quiet")
    flow.source(MemorySource([1, 2])).map(abs).sink(MemorySink("out"))
    print(flow.run(parallelism=1).output("out"))
""")


@pytest.mark.ray
def test_a_run_that_starts_ray_prints_its_output_and_not_rays_token_notice(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run([sys.executable, "-c", QUIET_RUN], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1, 2]"
    assert "Token authentication is enabled" not in done.stderr, done.stderr
