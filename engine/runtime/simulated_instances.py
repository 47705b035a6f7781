"""The stage instances of a simulated run, and the sink partitions that outlive them.

The simulator's scheduler (:mod:`.simulator`) decides when an instance starts and when a
crash or a rescale stops them all; this holds them: per instance the
:class:`~.instance_host.InstanceHost` the Ray stage actor runs too (its
:class:`~.stage.StageRuntime`, its :class:`~.stage_snapshots.StageSnapshots` with working
RocksDB files in the run's scratch directory and, for a source instance, its
:class:`~driftstream.engine.connectors.source_reader.SourceReader`). Sink partitions are
kept apart: a crash loses the instances, not what a sink wrote (a broker's topic keeps it).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> from driftstream.engine.model.config import InstanceConfig
>>> f = Flow("i")
>>> f.source(MemorySource([1, 2])).sink(MemorySink("o"))
>>> plan = f.plan(1)
>>> live = SimulatedInstances()
>>> host = live.start(plan, plan.instances[0], InstanceConfig(), seed=1, base_every_s=0.0, bundle_writer=print, send=print)
>>> sorted(live.hosts) == sorted(live.stages) == sorted(live.snapshots) == [plan.instances[0]], list(live.readers)
(True, [Instance(stage=0, index=0)])
>>> live.close(); live.stages
{}
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable

from driftstream.ordering.meta import TOP

from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.model.result import InstanceReport, RunResult, merge_instances
from driftstream.engine.runtime.instance_host import InstanceHost
from driftstream.engine.runtime.stage_snapshots import StageSnapshots

#: A memory-backed directory for the run's scratch files, where the machine has one.
MEMORY_DIR = "/dev/shm"


class SimulatedInstances:
    """The live instances of one run (``hosts``, and their ``stages``, ``snapshots``,
    ``readers``: per :class:`Instance`) and every sink partition any of them opened (``sinks``: per
    (sink step, instance)). ``clock``: the simulated time the runtimes see.

    The run's ``scratch`` directory (working databases, and the snapshot store unless the
    run names one) is in memory where the machine has a tmpfs, and removed by ``close``.
    """

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.scratch = tempfile.mkdtemp(prefix="driftstream-sim-", dir=MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None)
        self.sinks: dict = {}
        self.hosts: dict = {}
        self.stages: dict = {}
        self.snapshots: dict = {}
        self.readers: dict = {}

    def start(self, plan: Plan, instance: Instance, config: InstanceConfig, seed: int, base_every_s: float, bundle_writer: Callable,
              send: Callable, **runtime: Any) -> InstanceHost:
        """Start ``instance`` of ``plan`` from its part of a manifest (``config.restore``); returns
        its host. ``bundle_writer(sink step, partition, bundle)``: where its barriers' bundles
        go (the scheduler writes them when it chooses); ``send(to, message)``: where what it sends
        goes (see :class:`InstanceHost`); ``runtime``: more of :class:`~.stage.StageRuntime`'s
        options. O(the state it restores)."""
        host = self.host(plan, instance, config, seed, base_every_s, bundle_writer, send, self.scratch, **runtime)
        self.register(instance, host)
        return host

    def host(self, plan: Plan, instance: Instance, config: InstanceConfig, seed: int, base_every_s: float, bundle_writer: Callable,
             send: Callable, scratch: str, **runtime: Any) -> InstanceHost:
        """A host as :meth:`start` makes, not among the live ones (a replica that is not the
        primary, see simulated_replicas.py), its working databases in ``scratch``."""
        snaps = StageSnapshots(
            config.snapshot_dir, plan.participant(instance), config.restore, base_every_s, deferred=True, scratch=scratch, cache_bytes=config.state_cache_bytes
        )
        return InstanceHost(plan, instance, config, snaps, send, seed=seed, clock=self.clock, bundle_writer=bundle_writer,
                            sink_opener=lambda sid, index: self._open_sink(plan, sid, index), **runtime)

    def register(self, instance: Instance, host: InstanceHost) -> None:
        """``host`` is the live ``instance`` (its stage, snapshots and reader the run's)."""
        self.hosts[instance], self.stages[instance], self.snapshots[instance] = host, host.rt, host.snapshots
        if host.reader is not None:
            self.readers[instance] = host.reader

    def _open_sink(self, plan: Plan, sid: int, index: int):
        key = (sid, index)
        if key not in self.sinks:
            self.sinks[key] = plan.steps[sid].sink.open(index, plan.parallelism)
        return self.sinks[key]

    def stop(self) -> None:
        """Lose every instance (a crash, or a rescale's restart); their sink partitions live on."""
        for host in self.hosts.values():
            host.close(keep_sinks=True)
        self.hosts, self.stages, self.snapshots, self.readers = {}, {}, {}, {}

    def stop_one(self, instance: Instance) -> None:
        """Lose ``instance`` alone (a per-instance crash, recovery="local"); its sink partitions live on."""
        self.hosts.pop(instance).close(keep_sinks=True)
        for held in (self.stages, self.snapshots, self.readers):
            held.pop(instance, None)

    def source_ready(self, instance: Instance) -> bool:
        """Whether the source ``instance`` has something to do: read (it has credit), or send
        its final bound once it has read everything."""
        r = self.readers[instance]
        return (not r.done and r.has_credit()) or (r.done and self.hosts[instance].last_bound != TOP)

    def result(self, plan: Plan, seconds: float) -> RunResult:
        """The run's result: the metrics and latency samples of the live instances (with their
        snapshots' cache figures) and the output of every sink partition ever written (a
        rescale to fewer instances leaves some unopened at the end)."""
        reports = [InstanceReport({}, dict(rt.metrics(), state_cache=self.snapshots[i].cache_stats()), rt.emit_times, rt.release_times)
                   for i, rt in self.stages.items()]
        for (sid, _), partition in self.sinks.items():
            got = partition.collected()
            if got is not None:
                reports[0].collected.setdefault(plan.steps[sid].name, []).extend(got)
        return merge_instances(reports, seconds, [s.name for s in plan.steps if s.kind.is_sink])

    def close(self) -> None:
        """Close everything and remove the scratch directory."""
        for host in self.hosts.values():
            host.close()
        self.hosts, self.readers, self.stages, self.snapshots = {}, {}, {}, {}
        shutil.rmtree(self.scratch, ignore_errors=True)
