"""Which C accelerators of the pure core are built, and the switch that turns them off.

The pure core keeps its Python as the reference; a C module (``ordering/_drifting.c``,
``snapshots/_written.c``, built at install where a C compiler is) runs the same steps
faster. ``DRIFTSTREAM_PURE_PYTHON=1`` runs the Python alone where they are built: to
compare the two, or to debug.

>>> accelerator("driftstream.ordering._not_a_module") is None
True
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

#: The Python alone, whatever is built.
PURE_PYTHON = os.environ.get("DRIFTSTREAM_PURE_PYTHON") == "1"


def accelerator(name: str) -> Optional[ModuleType]:
    """The C module ``name`` (absolute), or None where it is not built or :data:`PURE_PYTHON`."""
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: no C compiler at install
        return None
