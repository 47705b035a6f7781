"""The one part of the build pyproject.toml cannot say: the C accelerators (the pure core's,
the barrier's sort, and the sinks' encoding).

They are optional: where they do not compile (no C compiler), the install goes on and the
engine runs the same logic in Python (``tests/ordering/test_in_order_path.py`` says which).
"""

from setuptools import Extension, setup

#: a C function the compiler does not know is an error, not a warning: it would crash at run time
FLAGS = ["-O2", "-Werror=implicit-function-declaration", "-Werror=int-conversion"]

setup(ext_modules=[
    Extension("driftstream.ordering._drifting", ["ordering/_drifting.c"], optional=True, extra_compile_args=FLAGS),
    Extension("driftstream.ordering._sorted_queue", ["ordering/_sorted_queue.c"], optional=True, extra_compile_args=FLAGS),
    Extension("driftstream.snapshots._written", ["snapshots/_written.c"], optional=True, extra_compile_args=FLAGS),
    Extension("driftstream.barriers._meta_sort", ["barriers/_meta_sort.c"], optional=True, extra_compile_args=FLAGS),
    Extension("driftstream.engine.connectors.kafka._record_batch", ["engine/connectors/kafka/_record_batch.c"], optional=True,
              extra_compile_args=FLAGS),
])
