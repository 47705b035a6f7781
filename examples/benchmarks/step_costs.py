"""What each step kind costs per element, in one process: the engine's own work beside the
user's function, with no Ray, transport or acker around it.

    driftstream bench step-costs                  # 200,000 elements, 3 rounds (best of)
    driftstream bench step-costs --elements 50000 --lag 0 --json out.json

One flow holds a step of every kind, each with a trivial function, so what is measured
is the engine: ``source -> map -> flat_map -> filter -> key_by -> stateful_map -> key_by
-> stateful_flat_map (MapState) -> key_by -> window (tumbling count) -> sink``. Its
stages run as :class:`~driftstream.engine.runtime.stage.StageRuntime` objects at
parallelism 1, fed 256 elements at a time (the run's batch size), each batch handed to
the next stage at once and the watermark moved to ``lag`` elements behind the source
after each (a backlog: a run keeps up to ``max_inflight``, 2,000, source records in
flight; 0: the live edge, where the watermark follows right behind). Each
operator's ``run`` is timed, and so is each keyed channel's routing (``key_by``: the key
function, the hash, the buffer), the watermark's work (each stateful step folding what
it settled, the window firing, the barrier releasing into the sink) and the rest of the
stage (the batches' bookkeeping). "function" is the same functions called in a plain loop: what is left is
what the engine adds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

#: elements per source read, as a run's default batch_size
CHUNK = 256
KEYS = 1_000


def _same(x: int) -> int:
    return x


def _one(x: int) -> tuple:
    return (x,)


def _keep(x: int) -> bool:
    return True


def _key(x: int) -> int:
    return x % KEYS


def _count(state: Optional[int], x: int) -> tuple:
    return (state or 0) + 1, x


def _mark(entries: Any, x: int) -> list:
    entries.put(x % 50, 1)
    return [x]


def _stamp(x: int) -> float:
    return x / 1000.0


def flow() -> Any:
    """The flow with one step of every kind (:data:`STEPS` names them)."""
    from driftstream.engine import Flow, MapState
    from driftstream.engine.testing import MemorySink, MemorySource
    from driftstream.engine.windows import Tumbling

    f = Flow("step-costs")
    (f.source(MemorySource([]), name="source").map(_same, name="map").flat_map(_one, name="flat_map").filter(_keep, name="filter")
     .key_by(_key, name="key_by").stateful_map(_count, name="stateful_map")
     .key_by(_key, name="key_by_2").stateful_flat_map(_mark, state=MapState, name="map_state")
     .key_by(_key, name="key_by_3").window(Tumbling(1.0), timestamp=_stamp, name="window").count()
     .sink(MemorySink("sink")))
    return f


class _Clock:
    """Seconds spent per label."""

    def __init__(self) -> None:
        self.spent: dict = {}

    def timed(self, label: str, fn: Callable) -> Callable:
        spent = self.spent
        spent.setdefault(label, 0.0)

        def run(*args: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[label] += time.perf_counter() - began

        return run


class _TimedOperator:
    """An operator whose run() is timed (its watermark side times its state's methods)."""

    __slots__ = ("op", "run", "name", "count", "settle", "on_watermark")

    def __init__(self, op: Any, clock: _Clock) -> None:
        self.op, self.name, self.count = op, op.name, 0
        self.run = clock.timed(op.name, op.run)
        self.settle, self.on_watermark = op.settle, op.on_watermark


def measure(elements: int, lag: int = 2_000) -> dict:
    """Seconds per label over one run of ``elements`` source elements, and the elements each step took."""
    from driftstream.engine.runtime.stage import StageRuntime
    from driftstream.ordering.meta import TOP

    plan = flow().plan(1, fuse=False)  # a stage per key_by: the routing between them is one of the figures
    clock = _Clock()
    stages = [StageRuntime(plan, i, 0, seed=1) for i in range(len(plan.stages))]
    for rt in stages:
        rt.operators = {sid: _TimedOperator(op, clock) for sid, op in rt.operators.items()}
        rt.outbound.route = clock.timed("routing (key_by)", rt.outbound.route)
        for sid, state in (*rt.keyed.items(), *rt.windows.items()):
            name = plan.steps[sid].name
            state.advance = clock.timed(f"{name}: fold below the watermark", state.advance)
            if sid in rt.windows:
                state.fire = clock.timed(f"{name}: fire closed windows", state.fire)
        rt.sinks._release = clock.timed("barrier: release into the sink", rt.sinks._release)
    began = time.perf_counter()
    for start in range(0, elements, CHUNK):
        stages[0].process_source([((o, 0, 0, o, (), False), o) for o in range(start, min(elements, start + CHUNK))])
        pending = stages[0].take_batches()
        while pending:
            nxt = []
            for stage, _, batch in pending:
                stages[stage].receive(batch)
                stages[stage].release_held(everything=True)
                nxt += stages[stage].take_batches()
            pending = nxt
        watermark = (min(elements, start + CHUNK) - lag, 0, 0, 0)
        for rt in stages:
            rt.on_watermark(watermark)
            rt.take_acks()
    for rt in stages:
        rt.on_watermark(TOP)
    total = time.perf_counter() - began
    counts = {op.name: op.count for rt in stages for op in rt.operators.values()}
    return {"total": total, "spent": dict(clock.spent), "counts": counts}


def function_costs(elements: int) -> dict:
    """Seconds of the flow's functions alone per step, called in a plain loop."""
    from driftstream.ordering.entry_state import EntryKeyedState

    xs = list(range(elements))
    out: dict = {}
    for name, call in (("map", _same), ("flat_map", _one), ("filter", _keep), ("routing (key_by)", _key)):
        began = time.perf_counter()
        for x in xs:
            call(x)
        out[name] = time.perf_counter() - began
    out["routing (key_by)"] *= 3  # three key_by channels, each calling its key function
    began, states = time.perf_counter(), {}
    for x in xs:
        states[x % KEYS] = _count(states.get(x % KEYS), x)[0]
    out["stateful_map"] = time.perf_counter() - began
    entries = EntryKeyedState(_mark).backend  # a dict of entries: MapState's storage at its cheapest

    class Entries:
        def put(self, entry: Any, value: Any) -> None:
            entries.put(0, entry, value)

    handle, began = Entries(), time.perf_counter()
    for x in xs:
        _mark(handle, x)
    out["map_state"] = time.perf_counter() - began
    return out


def step_costs(elements: int = 200_000, rounds: int = 3, lag: int = 2_000) -> list:
    """Rows per step kind: elements, µs per element in all, in the user's function, and the
    engine's part (the difference); best of ``rounds`` by total time."""
    from driftstream.engine.runtime import gc_policy

    gc_policy.install()  # the stage actors' collector policy, so the same engine is measured
    try:
        best = min((measure(elements, lag) for _ in range(rounds)), key=lambda m: m["total"])
    finally:
        gc_policy.uninstall()
    fn = function_costs(elements)
    rows = []
    for label, seconds in best["spent"].items():
        n = best["counts"].get(label) or best["counts"]["source"]  # routing and the watermark: per source element
        own = fn.get(label, 0.0)
        rows.append({"step": label, "elements": n, "us_per_element": round(seconds / n * 1e6, 3),
                     "function_us": round(own / n * 1e6, 3), "engine_us": round((seconds - own) / n * 1e6, 3)})
    stage_rest = best["total"] - sum(best["spent"].values())
    rows.append({"step": "the stage's own bookkeeping (batches, acks, samples, the input merge)", "elements": elements,
                 "us_per_element": round(stage_rest / elements * 1e6, 3), "function_us": 0.0,
                 "engine_us": round(stage_rest / elements * 1e6, 3)})
    rows.append({"step": "total, per source element", "elements": elements, "us_per_element": round(best["total"] / elements * 1e6, 3),
                 "function_us": round(sum(fn.values()) / elements * 1e6, 3),
                 "engine_us": round((best["total"] - sum(fn.values())) / elements * 1e6, 3)})
    return rows


def table(rows: list) -> str:
    """The rows as a Markdown table."""
    lines = ["| step | elements | µs per element | in the function | the engine's |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['elements']:,} | {r['us_per_element']} | {r['function_us']} | {r['engine_us']} |")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench step-costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=200_000, help="source elements (default 200,000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs, the fastest reported (default 3)")
    parser.add_argument("--lag", type=int, default=2_000, help="how far (source elements) the watermark trails (default 2,000: a backlog)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = step_costs(args.elements, args.rounds, args.lag)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
