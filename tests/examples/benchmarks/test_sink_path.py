"""driftstream.examples.benchmarks.sink_path: both paths release every record once, in the same
bundles and lines (what it times is the same work), and it reports a cost per part."""

from __future__ import annotations

import pytest

from driftstream.barriers import barrier
from driftstream.engine.connectors import file_sink
from driftstream.examples.benchmarks import sink_path

pytestmark = pytest.mark.skipif(barrier.NATIVE is None or file_sink.NATIVE is None, reason="the C accelerators are not built")


def test_both_paths_release_the_same_bundles_and_lines():
    batches = sink_path.chunks(120)
    released = {}
    for native in (True, False):
        saved, barrier.NATIVE = barrier.NATIVE, barrier.NATIVE if native else None
        try:
            _, bundles = sink_path.barrier_cost(batches)
        finally:
            barrier.NATIVE = saved
        released[native] = bundles
    assert released[True] == released[False]
    elements = [e for bundle in released[True] for e in bundle]
    assert len(elements) == sum(map(len, batches)) and [m for m, _ in elements] == sorted(m for m, _ in elements)
    assert b"".join(map(file_sink.json_lines, released[True])) == b"".join(map(bytes, map(file_sink.python_json_lines, released[True])))


def test_the_report_names_a_cost_per_part(capsys):
    result = sink_path.main(["--docs", "100", "--rounds", "1"])
    for path in ("python", "c"):
        assert set(result["us_per_record"][path]) == {"barrier", "latency samples", "file lines", "sink path"}
        assert all(v > 0 for v in result["us_per_record"][path].values())
    assert '"us_per_record"' in capsys.readouterr().out
