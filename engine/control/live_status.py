"""What ``status()`` of a running flow shows: figures the actors report now, read with the
history the other parts keep (snapshots: the committer; recoveries: failover; records an
at-most-once restart skipped: the launcher). It only reads; nothing here changes the run.

>>> _sum_known([None, 3, 4]), _sum_known([None, None])
(7, None)
"""

from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import ray

from driftstream.engine.model.live_figures import LATENCY_WINDOW_S, latencies_ms, watermark_lag_s, window_summary
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.run_counts import ZERO, RunCounts
from driftstream.engine.model.status import FlowStatus
from driftstream.engine.model.result import add_cache_stats, sum_per_step
from driftstream.engine.control.failover import Failover
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.snapshot_committer import SnapshotCommitter


@dataclass(frozen=True)
class SupervisorStatus:
    """A run's history so far, in one view: the last committed snapshots (``committed``
    counts them all), the recoveries, input records at-most-once restarts skipped (lost on
    purpose), and the snapshots the store failed: how many, how many in a row, the last
    one's error and since when they fail (None: the last one was committed)."""

    snapshots: deque
    committed: int
    recoveries: list
    skipped: int
    snapshot_failures: int
    failures_in_row: int
    last_snapshot_error: Optional[str]
    failing_since: Optional[float]


class LiveStatus:
    """Reads a run's figures from its actors and the history its parts keep."""

    def __init__(self, launcher: Launcher, committer: SnapshotCommitter, failover: Failover) -> None:
        self.launcher = launcher
        self.committer = committer
        self.failover = failover
        #: the manifest the run started from (None: the beginning), set once it is launched:
        #: the run's counts are those since, see :meth:`carried`
        self.started_from: Optional[Manifest] = None

    def carried(self) -> RunCounts:
        """What this run's incarnations before the running one settled below the T of the
        snapshot it restored (the restored manifest's counts less those the run started with):
        the running incarnation replays from there and counts the rest itself. Zero for a
        manifest written before counts were kept (the counts then start at that snapshot,
        :meth:`counted_since`)."""
        restored = self.committer.restored
        if restored is None or restored.counts is None:
            return ZERO
        start = self.started_from
        return restored.counts - (start.counts if start is not None and start.counts is not None else ZERO)

    def counted_since(self) -> Optional[int]:
        """The snapshot the counts start at when it recorded none (restored from a manifest written
        before counts were kept, or one an instance did not count), else None: the run's start."""
        restored = self.committer.restored
        if restored is None or restored.counts is not None or restored is self.started_from:
            return None
        return restored.snapshot_id

    def history(self) -> SupervisorStatus:
        """The run's history so far (the lists are the parts' own, not copies)."""
        log = self.committer.log
        return SupervisorStatus(log.records, log.committed, self.failover.recoveries, self.launcher.skipped,
                                log.failures, log.failures_in_row, log.last_error, log.failing_since)

    def read(self, latency_since: Optional[float] = None, latency_samples: bool = False) -> FlowStatus:
        """Watermark, progress and dead letters now, plus snapshot and recovery history.

        ``latency_ms``: release latency of the elements released since ``latency_since``
        (default: the last LATENCY_WINDOW_S seconds; see :mod:`.live_figures`);
        ``latency_samples`` adds the window's values (``"latency_samples_ms"``).
        Asked during a recovery, actors that are dead and not replaced yet are left out of
        the sums and counted in ``"unavailable"`` (the acker's figures are then None)."""
        now = time.time()
        since = now - LATENCY_WINDOW_S if latency_since is None else latency_since
        run = self.launcher
        # A launch replaces these, never fills them: one set of actors, and their plan, for both rounds.
        plan, acker, actors = run.plan, run.acker, run.actors
        # Sinks' counts are read in a round before the sources': the actors answer at different
        # moments, and in one round a sink could report elements a source emitted after it had
        # answered (released > emitted in a one-to-one flow). The sinks' release samples come
        # in the first round, the emit samples of those times in the second.
        first = _ask([acker.status.remote(), *(a.stats.remote(since) for a in actors.values())])
        verifier = None if run.verifier is None else _ask([run.verifier.stats.remote()])[0]
        stats = [s for s in first[1:] if s is not None]
        times = sorted({t for s in stats for t, _ in s["releases"]}) or None
        second = _ask([a.stats.remote(None, times if _stamps_emits(plan, k) else None) for k, a in actors.items()])
        acker_figures = first[0] or {"watermark": None, "in_flight": None}
        sources = [s for s in second if s is not None]
        self.failover.resolve()
        log = self.committer.log
        last = log.records[-1] if log.records else None
        carried = self.carried()
        step_dead_letters = sum_per_step([carried.dead_letters, *(s["step_dead_letters"] for s in stats)])
        elements, tombstones = sum_per_step(s["elements"] for s in stats), sum_per_step(s["tombstones"] for s in stats)
        out_of_order = sum_per_step(s["out_of_order"] for s in stats)
        latencies = latencies_ms((s["releases"] for s in stats), (s["emits"] for s in sources))
        return FlowStatus(
            steps={s.name: {"elements": elements.get(s.name, 0), "tombstones": tombstones.get(s.name, 0),
                            **({"out_of_order": out_of_order[s.name]} if s.name in out_of_order else {})} for s in plan.steps},
            latency_ms=window_summary(latencies),
            watermark_lag_s=watermark_lag_s(acker_figures["watermark"], plan, now),
            unavailable=max(first.count(None), second.count(None)),
            watermark=acker_figures["watermark"],
            in_flight=acker_figures["in_flight"],
            emitted=sum(s["emitted"] for s in sources),
            # over the run's recoveries: the earlier incarnations' below the restored snapshot, then this one's
            released=sum(carried.released.values()) + sum(s["released"] for s in stats),
            dead_letters=sum(step_dead_letters.values()),
            step_dead_letters=step_dead_letters,
            counted_since_snapshot=self.counted_since(),
            source_lag=_sum_known(s["source_lag"] for s in sources),
            source_partitions=[part for s in sources for part in s["source_partitions"]],
            source_behind=[part["behind"] for s in sources for part in s["source_partitions"] if part.get("behind")],
            skipped=run.skipped,
            state_cache=functools.reduce(add_cache_stats, (s["state_cache"] for s in stats), {}),
            late_elements=sum_per_step(s["late_elements"] for s in stats),
            last_snapshot=None if last is None else {
                "id": last.snapshot_id, "t": last.t, "duration_s": last.duration_s, "age_s": round(time.time() - last.committed_at, 3)},
            snapshots=log.committed,
            snapshot_failures=log.failures,
            last_snapshot_error=log.last_error,
            snapshots_failing_s=log.failing_s(time.time()),
            recoveries=[r.to_dict() for r in self.failover.recoveries],
            commit_groups={plan.stages[stage].name: hook.status() for stage, hook in self.committer.commit_hooks.items()},
            latency_samples_ms=latencies if latency_samples else None,
            reexecution=None if run.verifier is None else {
                **sum_per_step(s["reexecution"] for s in stats if "reexecution" in s), "verifier": verifier},
        )


def _stamps_emits(plan, instance: tuple) -> bool:
    """Whether ``instance`` notes emit samples: it reads a source or closes windows."""
    stage = plan.stages[instance[0]]
    return stage.source_id >= 0 or any(plan.steps[sid].kind.timed for sid in stage.step_ids)


def _ask(refs: list) -> list:
    """Each answer, or None for an actor that is dead or does not answer within 10 s."""
    answers = []
    for ref in refs:
        try:
            answers.append(ray.get(ref, timeout=10))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            answers.append(None)
    return answers


def _sum_known(values) -> Optional[int]:
    """Sum of the values that are not None; None if all are."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
