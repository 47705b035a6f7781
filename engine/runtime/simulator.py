"""The simulator runtime: the whole flow in one process, under a seeded adversarial scheduler.

Data batches are delivered in any order (across and within channels, with
arbitrary delays); control messages (acks to the acker, watermarks from it)
keep per-sender FIFO order, as Ray actor calls from one caller do. Sources read
chunks of random size whenever they have credit. Because the output of a run is
a function of its input alone, every seed must give the same output: that is
what the property tests check.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("sim")
>>> f.source(MemorySource(range(5), partitions=2)).map(lambda x: x * 10).sink(MemorySink("o"))
>>> {tuple(run_simulated(f.plan(2), RunConfig(seed=s)).output("o")) for s in range(5)}
{(0, 10, 20, 30, 40)}
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Optional

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import TOP

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.plan import Plan
from driftstream.engine.model.result import RunResult, merge_instances
from driftstream.engine.connectors.source import SourceReader
from driftstream.engine.runtime.stage import StageRuntime

ACKER = "acker"


#: What the simulator's scheduler gets when the run does not say: small batches and credit,
#: so that there are many interleavings for it to choose from.
SIMULATOR_BATCH_SIZE, SIMULATOR_MAX_INFLIGHT = 8, 64


class Simulation:
    """One seeded run. ``step()`` performs one scheduling decision; ``run()`` runs to the end."""

    def __init__(self, plan: Plan, seed: Optional[int] = None, batch_size: int = SIMULATOR_BATCH_SIZE, max_inflight: int = SIMULATOR_MAX_INFLIGHT) -> None:
        self.plan = plan
        self.rng = random.Random(seed)
        self.batch_size = batch_size
        self.clock_value = 0.0
        self.stages = {
            (s.index, i): StageRuntime(plan, s.index, i, seed=self.rng.getrandbits(32), clock=self._clock)
            for s in plan.stages
            for i in range(s.parallelism)
        }
        self.source_keys = plan.source_instances
        self.readers = [
            SourceReader(
                plan.steps[plan.stages[si].source_id].source, plan.stages[si].source_id, inst, plan.stages[si].parallelism, max_inflight, batch_size
            )
            for si, inst in self.source_keys
        ]
        self.reader_of = {key: r for key, r in zip(self.source_keys, self.readers)}
        self.bound_sent = [None] * len(self.readers)
        self.acker = Acker(sources=len(self.readers))
        self.data: list = []  # (stage, instance, Batch)
        self.control: dict = {}  # (sender, receiver) -> deque of messages
        self.watermark = self.acker.watermark
        self.steps_taken = 0

    def _clock(self) -> float:
        return self.clock_value

    def _send_control(self, sender, receiver, message) -> None:
        self.control.setdefault((sender, receiver), deque()).append(message)

    def _flush(self, key, source_index: Optional[int] = None) -> None:
        stage = self.stages[key]
        self.data.extend(stage.take_batches())
        acks = stage.take_acks()
        bound = None
        if source_index is not None:
            bound = self.readers[source_index].bound()
            if bound == self.bound_sent[source_index]:
                bound = None
            else:
                self.bound_sent[source_index] = bound
        if acks or bound is not None:
            self._send_control(key, ACKER, (acks, source_index, bound))

    def _eligible_sources(self) -> list:
        return [
            i
            for i, r in enumerate(self.readers)
            if (not r.done and r.has_credit()) or (r.done and self.bound_sent[i] != TOP)
        ]

    def step(self) -> bool:
        """Take one scheduling decision; False when nothing is left to do."""
        sources = self._eligible_sources()
        channels = [k for k, q in self.control.items() if q]
        kinds = [k for k, n in (("data", len(self.data)), ("control", len(channels)), ("source", len(sources))) if n]
        if not kinds:
            return False
        self.steps_taken += 1
        self.clock_value += 0.001
        kind = self.rng.choice(kinds)
        if kind == "data":
            i = self.rng.randrange(len(self.data))
            self.data[i], self.data[-1] = self.data[-1], self.data[i]
            stage, inst, batch = self.data.pop()
            self.stages[(stage, inst)].receive(batch)
            self._flush((stage, inst))
        elif kind == "control":
            sender, receiver = self.rng.choice(channels)
            message = self.control[(sender, receiver)].popleft()
            if receiver == ACKER:
                acks, source_index, bound = message
                w = self.acker.update(acks, source_index, bound)
                if w != self.watermark:
                    self.watermark = w
                    for key in self.stages:
                        self._send_control(ACKER, key, w)
            else:
                self.stages[receiver].on_watermark(message)
                reader = self.reader_of.get(receiver)
                if reader is not None:
                    reader.on_watermark(message)
        else:
            i = self.rng.choice(sources)
            key = self.source_keys[i]
            items = self.readers[i].poll(self.rng.randint(1, self.batch_size))
            if items:
                self.stages[key].process_source(items)
            self._flush(key, i)
        return True

    def run(self) -> RunResult:
        while self.step():
            pass
        if self.acker.watermark != TOP:
            raise RuntimeError(
                f"simulation stalled at watermark {self.acker.watermark} with {self.acker.in_flight()} times in flight"
            )
        reports = [
            {"collected": s.collected(), "metrics": s.metrics(), "emit_times": s.emit_times, "release_times": s.release_times}
            for s in self.stages.values()
        ]
        reports[0]["metrics"]["dead_letters"] = sum(r.dead_letters for r in self.readers)
        for r in self.readers:
            r.close()
        for s in self.stages.values():
            s.close()
        sinks = [s.name for s in self.plan.steps if s.kind == "sink"]
        return merge_instances(reports, self.clock_value, sinks)


def run_simulated(plan: Plan, config: Optional[RunConfig] = None) -> RunResult:
    """Run ``plan`` in this process under the seeded scheduler (see module doc).

    It honours ``seed``, ``batch_size`` and ``max_inflight``; any other option (a
    guarantee, snapshots, faults) is refused rather than silently left out."""
    config = config or RunConfig()
    refused = config.not_defaults("seed", "batch_size", "max_inflight")
    if refused:
        raise FlowError(
            f"the simulator cannot honour {', '.join(refused)}: it runs one process without snapshots, "
            "failures or Ray; run with runtime='ray' for those"
        )
    started = time.time()
    result = Simulation(
        plan,
        seed=config.seed,
        batch_size=config.batch_size or SIMULATOR_BATCH_SIZE,
        max_inflight=config.max_inflight or SIMULATOR_MAX_INFLIGHT,
    ).run()
    result.metrics.wall_time = time.time() - started
    return result
