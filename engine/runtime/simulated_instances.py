"""The stage instances of a simulated run, and the sink partitions that outlive them.

The simulator's scheduler (:mod:`.simulator`) decides when an instance starts and when a
crash or a rescale stops them all; this holds what they are made of: per instance its
:class:`~.stage.StageRuntime`, its :class:`~.stage_snapshots.StageSnapshots` (working
RocksDB files in the run's scratch directory) and, for a source instance, its
:class:`~driftstream.engine.connectors.source_reader.SourceReader`. Sink partitions are
kept apart: a crash loses the instances, not what a sink wrote (a broker's topic keeps it).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> from driftstream.engine.model.config import InstanceConfig
>>> f = Flow("i")
>>> f.source(MemorySource([1, 2])).sink(MemorySink("o"))
>>> plan = f.plan(1)
>>> live = SimulatedInstances()
>>> rt = live.start(plan, plan.instances[0], InstanceConfig(), seed=1, base_every_s=0.0, merging=True, bundle_writer=print)
>>> sorted(live.stages) == sorted(live.snapshots) == [plan.instances[0]], list(live.readers)
(True, [Instance(stage=0, index=0)])
>>> live.close(); live.stages
{}
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

from driftstream.ordering.meta import TOP

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.result import RunResult, merge_instances
from driftstream.engine.runtime.protocol import Ack
from driftstream.engine.runtime.stage import StageRuntime
from driftstream.engine.runtime.stage_snapshots import StageSnapshots

#: A memory-backed directory for the run's scratch files, where the machine has one.
MEMORY_DIR = "/dev/shm"


class SimulatedInstances:
    """The live instances of one run (``stages``, ``snapshots``, ``readers``: per
    :class:`Instance`) and every sink partition any of them opened (``sinks``: per
    (sink step, instance)). ``clock``: the simulated time the runtimes see.

    The run's ``scratch`` directory (working databases, and the snapshot store unless the
    run names one) is in memory where the machine has a tmpfs, and removed by ``close``.
    """

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.scratch = tempfile.mkdtemp(prefix="driftstream-sim-", dir=MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None)
        self.sinks: dict = {}
        self.stages: dict = {}
        self.snapshots: dict = {}
        self.readers: dict = {}
        self.bound_sent: dict = {}  # per source instance: the last bound it sent

    def start(self, plan: Plan, instance: Instance, config: InstanceConfig, seed: int, base_every_s: float, merging: bool,
              bundle_writer: Callable) -> StageRuntime:
        """Start ``instance`` of ``plan`` from its part of a manifest (``config.restore``); returns
        its runtime. ``bundle_writer(sink step, partition, bundle)``: where its barriers' bundles
        go (the scheduler writes them when it chooses). O(the state it restores)."""
        snaps = StageSnapshots(
            config.snapshot_dir, plan.participant(instance), config.restore, base_every_s, deferred=True, scratch=self.scratch, cache_bytes=config.state_cache_bytes
        )
        self.snapshots[instance] = snaps
        self.stages[instance] = rt = StageRuntime(
            plan,
            *instance,
            seed=seed,
            clock=self.clock,
            merging=merging,
            backend_factory=snaps.backend,
            bundle_writer=bundle_writer,
            sink_opener=lambda sid, index: self._open_sink(plan, sid, index),
            restore_t=config.restore_t,
        )
        if config.skip_released:
            rt.skip_released()
        reader = SourceReader.of_instance(plan, instance, config)
        if reader is not None:
            self.readers[instance] = reader
        return rt

    def _open_sink(self, plan: Plan, sid: int, index: int):
        key = (sid, index)
        if key not in self.sinks:
            self.sinks[key] = plan.steps[sid].sink.open(index, plan.parallelism)
        return self.sinks[key]

    def stop(self) -> None:
        """Lose every instance (a crash, or a rescale's restart); their sink partitions live on."""
        for snaps in self.snapshots.values():
            snaps.close()
        for reader in self.readers.values():
            reader.close()
        self.stages, self.snapshots, self.readers, self.bound_sent = {}, {}, {}, {}

    def outbox(self, instance: Instance, source_keys: list) -> tuple[list, list]:
        """What ``instance`` has to send: its batches ``(stage, instance, Batch)``, and its
        messages to the acker: one :class:`Ack` (XORs, and a source's new bound; its index is
        its place in ``source_keys``) if it has either, then the snapshot parts its sinks'
        acknowledged output allows. O(batches + acks)."""
        rt = self.stages[instance]
        batches = rt.take_batches()
        acks = rt.take_acks()
        reader = self.readers.get(instance)
        bound = None
        if reader is not None:
            bound = reader.bound()
            if bound == self.bound_sent.get(instance):
                bound = None
            else:
                self.bound_sent[instance] = bound
        messages = []
        if acks or bound is not None:
            messages.append(Ack(acks, source_keys.index(instance) if reader is not None else None, bound))
        messages.extend(rt.ready_parts())
        return batches, messages

    def source_ready(self, instance: Instance) -> bool:
        """Whether the source ``instance`` has something to do: read (it has credit), or send
        its final bound once it has read everything."""
        r = self.readers[instance]
        return (not r.done and r.has_credit()) or (r.done and self.bound_sent.get(instance) != TOP)

    def result(self, plan: Plan, seconds: float) -> RunResult:
        """The run's result: the metrics and latency samples of the live instances (with their
        snapshots' cache figures) and the output of every sink partition ever written (a
        rescale to fewer instances leaves some unopened at the end)."""
        reports = [
            {
                "collected": {},
                "metrics": dict(rt.metrics(), state_cache=self.snapshots[i].cache_stats()),
                "emit_times": rt.emit_times,
                "release_times": rt.release_times,
            }
            for i, rt in self.stages.items()
        ]
        for (sid, _), partition in self.sinks.items():
            got = partition.collected()
            if got is not None:
                reports[0]["collected"].setdefault(plan.steps[sid].name, []).extend(got)
        return merge_instances(reports, seconds, [s.name for s in plan.steps if s.kind.is_sink])

    def close(self) -> None:
        """Close everything and remove the scratch directory."""
        for r in self.readers.values():
            r.close()
        for s in self.stages.values():
            s.close()
        for s in self.snapshots.values():
            s.close()
        self.readers, self.stages, self.snapshots = {}, {}, {}
        shutil.rmtree(self.scratch, ignore_errors=True)
