"""What ``verify="reexecute:N"`` costs (issue 58): the inverted index's backlog (see
``driftstream bench backlog``) on Ray with ``verify="first"`` (the default: nothing checked)
against ``"reexecute:N"`` re-run in the instance's own process (``@process``, the default) and
on the flow's verifier (``@verifier``, another process), in one invocation, the runs
interleaved round by round so that a loaded machine's drift falls on every mode alike; each
run's output is checked against the sequential reference. Per mode: the median docs/s and CPU
seconds of the Ray session (raylet, actors, the verifier) per run, and their ratios to the first
mode's; with ``--small`` (a number of documents), each round also runs that many, and the
marginal CPU per document (the large run less the small one: what a flow's start costs, its
processes among it, falls out) is shown too, with each round's net docs/s. The load before and after.

    python -m driftstream.examples.reexecute_cost --docs 2000 --small 200 --rounds 3 --state entries,value
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Optional

from driftstream.engine.runtime.ray_session import ensure_ray
from driftstream.examples.benchmarks.backlog import RUN_OPTIONS, Backlog, documents, run_backlog
from driftstream.examples.inverted_index.files_basis import TreeCpu

MODES = ("first", "reexecute:100@verifier", "reexecute:100@process", "reexecute:10@verifier", "reexecute:10@process")


def options_of(mode: str) -> dict:
    """The run options of a mode: ``verify``, and ``@place`` as ``reexecute_on``.

    >>> options_of("reexecute:10@process")
    {'verify': 'reexecute:10', 'reexecute_on': 'process'}
    """
    verify, _, place = mode.partition("@")
    return {"verify": verify, **({"reexecute_on": place} if place else {})}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m driftstream.examples.reexecute_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=0, help="also run this many documents per round (0: not), for marginal figures")
    parser.add_argument("--state", default="entries,value", help="state forms, comma-separated: entries, value")
    parser.add_argument("--modes", default=",".join(MODES), help="verify values (with @verifier or @process), comma-separated")
    args = parser.parse_args(argv)
    ensure_ray()
    docs = documents(args.docs)
    modes = args.modes.split(",")
    print(f"load before: {os.getloadavg()}", flush=True)
    for state in args.state.split(","):
        rates: dict = {mode: [] for mode in modes}
        cpus: dict = {mode: [] for mode in modes}
        marginal: dict = {mode: [] for mode in modes}  # (net docs/s, CPU ms per document)
        for _ in range(args.rounds):
            for mode in modes:
                seconds, cpu_s = _run(args.docs, state, mode, docs)
                rates[mode].append(round(args.docs / seconds, 1))
                cpus[mode].append(cpu_s)
                if args.small:
                    small_s, small_cpu = _run(args.small, state, mode, docs[:args.small])
                    n = args.docs - args.small
                    # net docs/s: None when the small run took as long (its start outweighed the documents)
                    net = round(n / (seconds - small_s), 1) if seconds > small_s else None
                    marginal[mode].append((net, round((cpu_s - small_cpu) / n * 1e3, 2)))
        base, base_cpu = statistics.median(rates[modes[0]]), statistics.median(cpus[modes[0]])
        for mode in modes:
            rate, cpu_s = statistics.median(rates[mode]), statistics.median(cpus[mode])
            print(f"{state:8} {mode:24} docs/s {rate:7.1f} x{rate / base:.3f}  CPU s {cpu_s:6.2f} x{cpu_s / base_cpu:.3f}  "
                  f"(docs/s {rates[mode]}, CPU s {cpus[mode]})", flush=True)
        if args.small:
            ms0 = statistics.median(m[1] for m in marginal[modes[0]])
            for mode in modes:
                ms = statistics.median(m[1] for m in marginal[mode])
                print(f"{state:8} {mode:24} marginal: CPU ms/doc {ms:6.2f} x{ms / ms0:.3f}  (runs: net docs/s, CPU ms/doc {marginal[mode]})",
                      flush=True)
    print(f"load after: {os.getloadavg()}", flush=True)
    return 0


def _run(n: int, state: str, mode: str, docs: list) -> tuple:
    """One run of ``n`` documents: its wall seconds and the Ray session's CPU seconds."""
    cpu = TreeCpu(every=1.0)
    try:
        figures = run_backlog(Backlog(n, state, options={**RUN_OPTIONS, **options_of(mode)}), docs)
    finally:
        cpu_s = cpu.stop()
    if not figures["correct"] or figures["recoveries"]:
        print(f"{state} {mode} ({n} docs): wrong output or a recovery: {figures}", flush=True)
    return figures["seconds"], cpu_s


if __name__ == "__main__":
    raise SystemExit(main())
