"""What the demo and the examples need beyond ``pip install driftstream``, checked before they
start, each missing one said in one line with how to get it (instead of a JVM's 50-line
``JAVA_GATEWAY_EXITED`` or ``No module named 'rich'`` half-way through).

>>> missing([python_module("json", "bench")])
[]
>>> print(missing([python_module("no_such_module_here", "bench")])[0])
the Python package 'no_such_module_here': pip install 'driftstream[bench]' (or pip install -e '.[bench]' in a clone)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

from driftstream.engine.model.errors import FlowError


@dataclass(frozen=True)
class Prerequisite:
    """Something a program needs: ``found()`` says whether it is here, ``how`` how to get it."""

    what: str
    found: Callable[[], bool]
    how: str

    def __str__(self) -> str:
        return f"{self.what}: {self.how}"


class MissingPrerequisites(FlowError):
    """What a program needs and this machine lacks, each with how to get it."""


def java_executable() -> Optional[str]:
    """The ``java`` PySpark would start: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def java(why: str = "PySpark's ground truth") -> Prerequisite:
    return Prerequisite(f"Java 17 or newer ({why})", lambda: java_executable() is not None,
                        "apt-get install openjdk-17-jre-headless (or another JDK 17+), or set JAVA_HOME")


def postgres_programs() -> Prerequisite:
    """PostgreSQL's server programs, which the examples' local server (initdb, pg_ctl) runs."""

    def found() -> bool:
        return shutil.which("initdb") is not None or bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))

    return Prerequisite("PostgreSQL's server programs (initdb, pg_ctl)", found,
                        "apt-get install postgresql (or brew install postgresql), or pass your own server's DSN")


def python_module(name: str, extra: str) -> Prerequisite:
    return Prerequisite(f"the Python package {name!r}", lambda: importlib.util.find_spec(name) is not None,
                        f"pip install 'driftstream[{extra}]' (or pip install -e '.[{extra}]' in a clone)")


#: what ``driftstream demo`` needs: the local broker and Ray come with driftstream itself
DEMO = (python_module("rich", "bench"), python_module("pyspark", "bench"), python_module("pandas", "bench"), java())


def missing(prerequisites) -> list:
    """The prerequisites not found here, in order."""
    return [p for p in prerequisites if not p.found()]


def require(program: str, prerequisites) -> None:
    """Raise :class:`MissingPrerequisites` naming every one ``program`` lacks (nothing if none)."""
    lacking = missing(prerequisites)
    if lacking:
        lines = "\n".join(f"  - {p}" for p in lacking)
        raise MissingPrerequisites(f"{program} needs what this machine lacks:\n{lines}")
