"""Windows and joins on Ray, as the simulator's properties check them: for random inputs
(out-of-order event times, late elements, empty windows, session merges, missing join sides,
table updates racing lookups), random batch delays (``chaos``: batches overtake each other on
a channel, so state rolls back), parallelism 1-4 and a killed stateful actor, the output is
the sequential reference's: the input in t order. Each example is a real run (a few seconds),
so there are fewer of them than on the simulator."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.barriers.json_payloads import json_default
from driftstream.engine.windows import Session, Sliding, Tumbling
from tests.engine.api import test_joins as joins
from tests.engine.api import test_windows as windows
from tests.reference import reference_outputs

RATE = 400  # elements/s: a run (0.2-0.5 s) spans many 20 ms snapshots, so the kill meets a commit
_runs = itertools.count()

window_cases = st.tuples(
    st.just("window"),
    st.one_of(st.builds(Tumbling, st.sampled_from([0.01, 0.025])), st.builds(Sliding, st.just(0.02), st.sampled_from([0.005, 0.01])),
              st.builds(Session, st.sampled_from([0.003, 0.008]))),
    st.sampled_from(["count", "collect", "fold", "reduce"]),
    # (key, lag behind its index in ms, value): a lag beyond the window and its lateness is late
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40), st.sampled_from("xyz")), min_size=80, max_size=200),
)
join_cases = st.tuples(
    st.just("join"),
    st.sampled_from([("lookup", "lookup", None), ("join", "inner", Tumbling(0.01)), ("join", "left", Sliding(0.02, 0.01)),
                     ("join", "outer", Tumbling(0.005)), ("interval", "left", (-0.004, 0.002)), ("interval", "outer", (0, 0.003))]),
    st.booleans(),  # two sources
    st.lists(st.tuples(st.sampled_from("LR"), st.sampled_from("abc"), st.integers(0, 9)), min_size=80, max_size=200),
)


# No shrinking: each step of it is a run on Ray; a failure reports the generated example (its seed included).
@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=st.one_of(window_cases, join_cases), parallelism=st.integers(1, 4), chaos=st.sampled_from([0.002, 0.01]),
       seed=st.integers(0, 2**16), kill=st.booleans())
def test_any_delays_parallelism_and_kill_on_ray_give_the_sequential_output(ray_session, case, parallelism, chaos, seed, kill):
    name = f"onray{next(_runs)}"
    with tempfile.TemporaryDirectory(prefix="onray-") as tmp:
        out = FileSink(Path(tmp) / "out", name="out")
        if case[0] == "window":
            _, assigner, aggregate, rows = case
            data = [(key, i - lag, value) for i, (key, lag, value) in enumerate(rows)]
            late = FileSink(Path(tmp) / "late", name="late")

            def build(**sinks):
                return windows.build(data, assigner, aggregate, lateness=0.002, partitions=2, name=name, rate=RATE, **sinks)

            reference, flow = reference_outputs(build()), build(sink=out, late_sink=late)
        else:
            _, (op, how, window), two_sources, data = case

            def build(**sinks):
                return joins.build(data, op, how, window, partitions=2, name=name, rate=RATE, two_sources=two_sources, **sinks)

            reference, flow = reference_outputs(build()), build(sink=out)
        # an instance of the stage that holds the window or the join (at parallelism 1, fused, a source's)
        plan = flow.plan(parallelism)
        stage = next(st for st in plan.stages if any(plan.steps[i].kind.stateful for i in st.step_ids))
        faults = {"before_commit": [stage.actor_names[seed % parallelism]]} if kill else {}
        result = flow.run(parallelism=parallelism, guarantee="exactly-once", snapshot_interval=0.02, snapshot_dir=str(Path(tmp) / "snaps"),
                          chaos=chaos, seed=seed, batch_size=8, faults=faults)
        for sink in reference:
            got = [p for _, p in read_file_sink(Path(tmp) / sink, sink)]
            assert got == json.loads(json.dumps(reference[sink], default=json_default)), (sink, result.metrics.recoveries)
        assert result.metrics.recoveries == (1 if kill else 0)
