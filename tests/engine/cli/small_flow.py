"""A small flow for the CLI tests."""

from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource

flow = Flow("cli-small")
flow.source(MemorySource(["b a", "a"], partitions=2)).flat_map(str.split).key_by(lambda w: w).stateful_map(
    lambda n, w: ((n or 0) + 1, f"{w}={(n or 0) + 1}")
).sink(MemorySink("counts"))

no_sink = Flow("cli-nosink")
no_sink.source(MemorySource([1]))
