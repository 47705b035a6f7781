"""What ``FlowHandle.status()`` shows of a running flow, as one typed record: the live
figures the actors report, the run's history (snapshots, recoveries, rescales) and its
layout. :meth:`FlowStatus.to_dict` is its one serialisation, the dict ``status()``
returns, the CLI prints and the metrics export reads (docs/operations.md lists it).

>>> s = FlowStatus(watermark=(7, 0, 0, 7), emitted=10, released=9)
>>> d = s.to_dict(); d["released"], d["recoveries"], "latency_samples_ms" in d
(9, [], False)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class FlowStatus:
    """One ``status()`` answer (see docs/operations.md, "status() and the CLI's status view")."""

    #: per step: ``elements``, ``tombstones`` (and ``out_of_order`` for a stateful step), this incarnation
    steps: dict = field(default_factory=dict)
    #: release latency over the last 10 s: ``p50``, ``p95``, ``p99``, ``count`` (None: no samples)
    latency_ms: Optional[dict] = None
    #: seconds the watermark trails the clock (sources with wall-clock times), else None
    watermark_lag_s: Optional[float] = None
    #: actors that did not answer (dead and not yet replaced): left out of the sums
    unavailable: int = 0
    watermark: Optional[tuple] = None
    in_flight: Optional[int] = None
    #: elements the sources emitted in this incarnation
    emitted: int = 0
    #: elements the sinks hold, over the run's recoveries (see :mod:`.run_counts`)
    released: int = 0
    #: dead letters over the run's recoveries, and per failing step
    dead_letters: int = 0
    step_dead_letters: dict = field(default_factory=dict)
    #: the snapshot the counts start at when it recorded none (else None: the run's start)
    counted_since_snapshot: Optional[int] = None
    source_lag: Optional[int] = None
    source_partitions: list = field(default_factory=list)
    source_behind: list = field(default_factory=list)
    #: input records at-most-once recoveries skipped
    skipped: int = 0
    state_cache: dict = field(default_factory=dict)
    late_elements: dict = field(default_factory=dict)
    #: ``id``, ``t``, ``duration_s``, ``age_s`` of the last committed snapshot (None: none yet)
    last_snapshot: Optional[dict] = None
    snapshots: int = 0
    snapshot_failures: int = 0
    last_snapshot_error: Optional[str] = None
    #: seconds snapshots have failed in a row (0: the last one was committed)
    snapshots_failing_s: float = 0.0
    #: per recovery, ``Recovery.to_dict()``
    recoveries: list = field(default_factory=list)
    #: per Kafka source with a commit group: its last committed offsets
    commit_groups: dict = field(default_factory=dict)
    parallelism: Optional[int] = None
    max_parallelism: Optional[int] = None
    #: per rescale, the rescaler's report
    rescales: list = field(default_factory=list)
    corrupt_snapshots: list = field(default_factory=list)
    #: verify="majority": per dissent of an instance's replicas, ``instance``, ``replicas`` (the
    #: dissenters), ``kind``, ``epoch``, ``t_range``, every voter's ``digests`` and the ``action``
    dissents: list = field(default_factory=list)
    #: verify="reexecute:N" on the verifier: the instances' batches ``sent``, ``verified``,
    #: ``dropped`` (past their bound), ``lost`` (the verifier died: Ray restarts it), ``late`` (no
    #: verdict within the deadline), ``outstanding``, ``held`` (parts and sink writes), and the ``verifier``'s own
    #: ``reruns`` and ``cpu_s`` since its process started (None: it does not answer). None: not on.
    reexecution: Optional[dict] = None
    #: per keyed stage, the key groups each instance owns
    key_groups: dict = field(default_factory=dict)
    #: the window's latencies, when asked for (``latency_samples=True``); left out of the dict otherwise
    latency_samples_ms: Optional[list] = None

    def to_dict(self) -> dict:
        """The dict ``status()`` returns: every field, ``latency_samples_ms`` only when asked for."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.latency_samples_ms is None:
            del out["latency_samples_ms"]
        return out
