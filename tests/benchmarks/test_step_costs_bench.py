"""µs per element of each step kind, in one process (driftstream bench step-costs, short).
Figures are printed and kept in pytest-benchmark's extra_info; asserts that every step of
the flow is measured and took the elements it should, not how fast."""

from __future__ import annotations

from driftstream.examples.benchmarks import step_costs


def test_step_costs(benchmark):
    rows = benchmark.pedantic(step_costs.step_costs, kwargs={"elements": 3_000, "rounds": 1, "lag": 500}, rounds=1, iterations=1)
    print("\n" + step_costs.table(rows))
    by_step = {r["step"]: r for r in rows}
    benchmark.extra_info.update({step: r["us_per_element"] for step, r in by_step.items()})
    for step in ("map", "flat_map", "filter", "stateful_map", "map_state", "window", "sink", "routing (key_by)",
                 "map_state: fold below the watermark", "window: fire closed windows", "barrier: release into the sink"):
        assert by_step[step]["us_per_element"] > 0, step
    assert by_step["map"]["elements"] == by_step["stateful_map"]["elements"] == 3_000  # one output per element all the way
    total = by_step["total, per source element"]
    assert abs(sum(r["us_per_element"] for r in rows[:-1]) - total["us_per_element"]) < 0.01 * total["us_per_element"] + 0.01
