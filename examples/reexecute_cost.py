"""What ``verify="reexecute:N"`` costs (issue 58): the inverted index's backlog (see
``driftstream bench backlog``) on Ray with ``verify="first"`` (the default: nothing checked)
against ``"reexecute:100"`` and ``"reexecute:10"``, in one invocation, the runs interleaved
round by round so that a loaded machine's drift falls on every mode alike; each run's output is
checked against the sequential reference.

    python -m driftstream.examples.reexecute_cost --docs 3000 --rounds 3 --state entries,value
"""

from __future__ import annotations

import argparse
import statistics
from typing import Optional

from driftstream.engine.runtime.ray_session import ensure_ray
from driftstream.examples.benchmarks.backlog import RUN_OPTIONS, Backlog, documents, run_backlog

MODES = ("first", "reexecute:100", "reexecute:10")


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m driftstream.examples.reexecute_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--state", default="entries,value", help="state forms, comma-separated: entries, value")
    parser.add_argument("--modes", default=",".join(MODES), help="verify values, comma-separated")
    args = parser.parse_args(argv)
    ensure_ray()
    docs = documents(args.docs)
    modes = args.modes.split(",")
    for state in args.state.split(","):
        rates: dict = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode in modes:
                figures = run_backlog(Backlog(args.docs, state, options={**RUN_OPTIONS, "verify": mode}), docs)
                if not figures["correct"] or figures["recoveries"]:
                    print(f"{state} {mode}: wrong output or a recovery: {figures}")
                rates[mode].append(figures["docs_per_s"])
        base = statistics.median(rates[modes[0]])
        for mode in modes:
            median = statistics.median(rates[mode])
            print(f"{state:8} {mode:14} docs/s {median:8.1f} (runs {rates[mode]})  x{median / base:.3f} of {modes[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
