"""The demo and the examples check what they need before they start, and say in one line
each how to get what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from driftstream.examples.prerequisites import DEMO, MissingPrerequisites, java, java_executable, python_module, require


def test_the_demo_without_java_says_how_to_get_it_at_once(tmp_path):
    """A PATH with the venv's programs but no java, and no JAVA_HOME: one message, no JVM traceback."""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)
    began = time.monotonic()
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "driftstream"), "demo", "--seconds", "1"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    assert "driftstream demo needs what this machine lacks" in done.stderr
    assert "Java 17 or newer (PySpark's ground truth): apt-get install openjdk-17-jre-headless" in done.stderr
    assert "Traceback" not in done.stderr and "JAVA_GATEWAY_EXITED" not in done.stderr
    assert took < 60, f"the check took {took:.1f} s"


def test_java_is_found_from_java_home_or_the_path(tmp_path, monkeypatch):
    fake = tmp_path / "jdk" / "bin"
    fake.mkdir(parents=True)
    (fake / "java").write_text("#!/bin/sh\n")
    (fake / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert java_executable() == str(fake / "java") and java().found()
    monkeypatch.delenv("JAVA_HOME")
    assert java_executable() is None and not java().found()


def test_require_names_every_missing_one():
    with pytest.raises(MissingPrerequisites) as info:
        require("an example", [python_module("json", "bench"), python_module("no_such_pkg_a", "bench"),
                               python_module("no_such_pkg_b", "postgres")])
    lines = str(info.value).splitlines()
    assert lines[0] == "an example needs what this machine lacks:"
    assert lines[1:] == ["  - the Python package 'no_such_pkg_a': pip install 'driftstream[bench]' (or pip install -e '.[bench]' in a clone)",
                         "  - the Python package 'no_such_pkg_b': pip install 'driftstream[postgres]' (or pip install -e '.[postgres]' in a clone)"]
    assert [p.what for p in DEMO][:2] == ["the Python package 'rich'", "the Python package 'pyspark'"]
