"""The one part of the build pyproject.toml cannot say: the ordering core's C accelerator.

It is optional: where it does not compile (no C compiler), the install goes on and the
engine runs the same logic in Python (``driftstream.ordering.native.ACCELERATED`` says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("driftstream.ordering._drifting", ["ordering/_drifting.c"], optional=True,
                             extra_compile_args=["-O2", "-Werror=implicit-function-declaration", "-Werror=int-conversion"])])
