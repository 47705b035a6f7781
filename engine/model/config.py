"""How a run is configured: one frozen :class:`RunConfig`, validated once in the driver,
and the :class:`InstanceConfig` the supervisor derives from it for each stage actor.

>>> RunConfig.from_options(guarantee="exactly-once", snapshot_interval=0.5).guarantee
<Guarantee.EXACTLY_ONCE: 'exactly-once'>
>>> RunConfig.from_options(guarantee="twice")
Traceback (most recent call last):
...
driftstream.engine.model.errors.FlowError: guarantee must be one of exactly-once, at-least-once, at-most-once, none; got 'twice'
>>> RunConfig.from_options(snapshot_intreval=1)
Traceback (most recent call last):
...
driftstream.engine.model.errors.FlowError: unknown run option 'snapshot_intreval'; did you mean 'snapshot_interval'? the options are: allow_new_partitions, ...
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Optional, TypedDict, Union

from driftstream.engine.model.data_plane import DataPlaneTLS
from driftstream.engine.model.errors import FlowError
from driftstream.engine.model.manifest import SnapshotPart
from driftstream.engine.model.plan import Instance

#: How much lower than the stage actors and the acker the coordinator's process runs
#: (an ``os.nice`` increment; Ray starts every worker at its ``worker_niceness``, 15 by
#: default, so the coordinator ends at Linux's floor, 19). Its work is background:
#: committing manifests, heartbeats, recovery; at the workers' priority it competed for
#: the cores every hop of an element waits for. Interleaved A/B rounds (1,000 documents
#: at 50 docs/s, 2 cores), exactly-once p50 minus ``none``'s: median +6.9 ms (7 rounds)
#: at the workers' niceness, +2.6 (10 rounds) at 10 more.
COORDINATOR_NICENESS = 10


#: Seconds between two recordings of a run's Ray metrics (two ``stats()`` calls to every
#: actor each); Ray reports metrics every 10 s by default, so each report is fresh. Cost,
#: exactly-once with 1 s snapshots, export off and on in turn, Ray collecting metrics for
#: both, 2 shared cores: the inverted index at 50 docs/s through Kafka, 4 rounds, p50 13.3
#: ms without, 13.5 with (per-round difference, median +0.3 ms), p99 34.5 / 33.9
#: (examples/inverted_index/results/metrics-export-ab.json); the exactly-once bench at 50
#: elements/s, p50 on minus off -0.03 ms (6 rounds) and +0.56 ms (4) at 5 s, +0.09 ms (4)
#: at 1 s, p99 differences within the spread of the runs without export
#: (examples/benchmarks/results/metrics-export-cost.json).
METRICS_INTERVAL_S = 5.0

#: ``source_alignment`` that lets each source say how far past the slowest of its partitions
#: (in its own time units) a partition may read: its ``alignment_slack`` (a KafkaSource: 2 ms
#: of record time; an in-memory source, whose times count elements: None, not aligned).
AUTO_ALIGNMENT = "auto"
#: Aligned sources by default, each on its own terms (see engine/connectors/alignment.py):
#: over a Kafka backlog with 1 ms of record time per document, 2 ms (with the input merge)
#: cut the index's out-of-order elements from 15-22% to under 0.1% at no live-edge cost (p50
#: -0.2 ms, p99 +1.9 ms); a sparse backlog reads at least ALIGNMENT_RUN records per round
#: trip to the acker (the slack stretches to that many of the partition's own records).
DEFAULT_SOURCE_ALIGNMENT = AUTO_ALIGNMENT


def source_slack(configured: Any, source: Any) -> Optional[float]:
    """The alignment slack of ``source`` under ``RunConfig.source_alignment`` ``configured``:
    the source's own ``alignment_slack`` for ``"auto"``, else ``configured`` (None: off).

    >>> from types import SimpleNamespace as NS
    >>> source_slack("auto", NS(alignment_slack=2.0)), source_slack(5, NS(alignment_slack=2.0)), source_slack("auto", NS())
    (2.0, 5, None)
    """
    return getattr(source, "alignment_slack", None) if configured == AUTO_ALIGNMENT else configured


def plan_alignment(plan: Any, configured: Any) -> Any:
    """``configured`` for a run of ``plan``, except that ``"auto"`` aligns nothing in a plan
    without keyed state: alignment only spares order-sensitive state its repairs, and holding
    sources for the frontier's round trip cost a stateless backlog (Nexmark q1 from files)
    three quarters of its rate.

    >>> from types import SimpleNamespace as NS
    >>> plan_alignment(NS(stateful_steps=[]), "auto"), plan_alignment(NS(stateful_steps=["count"]), "auto"), plan_alignment(NS(stateful_steps=[]), 5)
    (None, 'auto', 5)
    """
    return None if configured == AUTO_ALIGNMENT and not plan.stateful_steps else configured


def aligned_sources(plan: Any, configured: Any) -> Optional[list]:
    """``(instance, group)`` of the source instances that align (told their source's frontier,
    see :attr:`~driftstream.engine.model.plan.Plan.source_groups`); None when none does."""
    configured = plan_alignment(plan, configured)
    aligned = [(inst, group) for inst, group in zip(plan.source_instances, plan.source_groups)
               if source_slack(configured, plan.steps[plan.stages[inst.stage].source_id].source) is not None]
    return aligned or None


class Guarantee(str, Enum):
    """What a run promises about its output when actors fail (a ``str``: compares equal to its value)."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    AT_MOST_ONCE = "at-most-once"
    NONE = "none"

    @classmethod
    def parse(cls, value: Any) -> "Guarantee":
        try:
            return cls(value)
        except ValueError:
            raise FlowError(f"guarantee must be one of {', '.join(g.value for g in cls)}; got {value!r}") from None


#: RunConfig.recovery's values: every instance rolls back, or only the failed one restores
RECOVERY_MODES = ("global", "local")

#: RunConfig.verify's values: what the receivers of an instance's replicas check (issue 58)
VERIFY_MODES = ("first", "majority")

#: RunConfig.reexecute_on's values: where a verify="reexecute:N" re-run runs on Ray
REEXECUTE_PLACES = ("verifier", "process")


def reexecute_every(verify: str) -> Optional[int]:
    """N of ``verify="reexecute:N"`` (one keyed batch in N re-run on a copy, see
    runtime/reexecuted_step.py); None for any other value. A malformed N is a FlowError.

    >>> reexecute_every("reexecute:100"), reexecute_every("first")
    (100, None)
    """
    return _one_in(verify, "reexecute", "one batch in N re-run")


def _refuse_unvoted_sinks(plan: Any, voted: dict) -> None:
    """A FlowError if under ``verify="majority"`` a sink is in a stage without replicas that a voted
    stage (``voted``: stage index -> a step named in ``replicas``) feeds, directly or through
    others: the gate holds only the replicas' sink bundles, so that sink would write what a
    corrupt primary sent before the vote that finds it. O(instances x channels): the plan's cones.

    >>> from driftstream.engine import Flow
    >>> from driftstream.engine.testing import MemorySource, MemorySink
    >>> f = Flow("r"); f.source(MemorySource([1]), name="src").key_by(str).count(name="c").key_by(str).count(name="d").sink(MemorySink("o"))
    >>> _refuse_unvoted_sinks(f.plan(2), {2: "d"})            # the sink's stage is voted
    >>> _refuse_unvoted_sinks(f.plan(2), {1: "c"})
    Traceback (most recent call last):
    driftstream.engine.model.errors.FlowError: verify='majority' releases a voted stage's output once its replicas agree, but sink 'o' is in a stage without replicas that step 'c' feeds: it would write what a corrupt replica sent before the vote. Name its stage in replicas too (one of d), or use verify='sample:N' (output leaves before its vote)
    """
    downstream = plan.cones().downstream  # instance -> the instances it has a path to
    for i, step in sorted(voted.items()):
        for index in sorted({k.stage for k in downstream[Instance(i, 0)]} - set(voted)):
            stage = plan.stages[index]
            sinks = [plan.steps[sid].name for sid in stage.step_ids if plan.steps[sid].kind.is_sink]
            if sinks:
                raise FlowError(f"verify='majority' releases a voted stage's output once its replicas agree, but sink {sinks[0]!r} is "
                                f"in a stage without replicas that step {step!r} feeds: it would write what a corrupt replica sent before "
                                f"the vote. Name its stage in replicas too (one of {', '.join(_nameable(plan, stage))}), or use "
                                f"verify='sample:N' (output leaves before its vote)")


def _nameable(plan: Any, stage: Any) -> list:
    """The steps of ``stage`` a user would name in ``replicas`` (not its key_by, not its sinks)."""
    return [plan.steps[sid].name for sid in stage.step_ids if not (plan.steps[sid].kind.is_sink or plan.steps[sid].kind.shuffles)]


def vote_sample(verify: str) -> Optional[int]:
    """N of ``verify="sample:N"`` (replicas vote on one epoch in N after its output left, see
    runtime/simulated_votes.py); None for any other value. A malformed N is a FlowError.

    >>> vote_sample("sample:4"), vote_sample("majority")
    (4, None)
    """
    return _one_in(verify, "sample", "one epoch in N voted")


def _one_in(verify: str, mode: str, meaning: str) -> Optional[int]:
    """N of ``verify="<mode>:N"``; None for another mode."""
    if not isinstance(verify, str) or not verify.startswith(mode + ":"):
        return None
    text = verify[len(mode) + 1:]
    if not text.isdigit() or int(text) < 1:
        raise FlowError(f"verify='{mode}:N' takes an int N >= 1 ({meaning}), not {verify!r}")
    return int(text)


def refuse_on_ray(options: Mapping[str, Any], plan: Any = None) -> None:
    """A FlowError for the options the Ray runtime cannot honour yet: ``replicas`` > 1 with
    ``verify="reexecute:N"`` (it takes replicas=1); and, before any actor starts, for a
    ``replicas`` mapping that does not fit ``plan`` (see :meth:`RunConfig.replicated`).

    >>> refuse_on_ray({"replicas": 2, "recovery": "local", "verify": "reexecute:2"})
    Traceback (most recent call last):
    ...
    driftstream.engine.model.errors.FlowError: verify='reexecute:2' runs with replicas=1; replicas take verify='first' (crash faults), 'majority' or 'sample:N'
    >>> refuse_on_ray({"replicas": 2, "recovery": "local", "verify": "sample:2"})
    """
    if options.get("replicas", 1) == 1:
        return
    if plan is not None and isinstance(options["replicas"], Mapping):
        RunConfig.from_options(**options).replicated(plan)
    verify = options.get("verify", "first")
    if verify not in ("first", "majority") and vote_sample(verify) is None:
        raise FlowError(f"verify={verify!r} runs with replicas=1; replicas take verify='first' (crash faults), 'majority' "
                        "or 'sample:N'")


#: options the engine and its tests set, not a user: accepted, never listed
INTERNAL_OPTIONS = frozenset({"faults", "keep_parallelism"})


@dataclass(frozen=True)
class RunConfig:
    """Every option of a run, each default written here once.

    ``batch_size`` / ``max_inflight`` None: the runtime's own (Ray: 256 / 2,000; the
    simulator: 8 / 64, small so its scheduler has many interleavings to choose from).
    ``faults`` is for tests: ``{"before_commit" | "after_restore": [actor name, ...]}``.
    """

    seed: Optional[int] = None
    batch_size: Optional[int] = None
    max_inflight: Optional[int] = None
    chaos: Optional[float] = None
    sample_every: int = 1
    guarantee: Guarantee = Guarantee.NONE
    snapshot_interval: float = 1.0
    snapshot_dir: Optional[str] = None
    #: start from the newest snapshot in ``snapshot_dir``, which must fit the flow (see
    #: model/manifest_fit.py); at another parallelism its key groups are reassigned
    resume: bool = False
    #: discard the snapshots in ``snapshot_dir`` and start from the beginning; without it a
    #: start that is not a resume refuses a directory that holds snapshots
    fresh: bool = False
    #: resume although stateful steps were added (they start empty) or removed (their state is dropped)
    allow_state_changes: bool = False
    #: resume although a source has more partitions than the snapshot knows (the new ones are read from their start)
    allow_new_partitions: bool = False
    #: resume at the newest snapshot's parallelism, whatever the plan's (a coordinator that
    #: died and restarts continues a rescaled flow as it was)
    keep_parallelism: bool = False
    faults: Mapping[str, tuple] = field(default_factory=dict)
    heartbeat_timeout: float = 10.0
    #: seconds a snapshot may take (its marker to its last part) before the instances that
    #: have not answered are taken for hung; a backlog makes snapshots slow, not actors hung
    snapshot_timeout: float = 120.0
    #: seconds snapshots may fail in a row (the store unwritable: full disk, read-only mount,
    #: object store errors) while the run goes on; past them the run stops, since a recovery
    #: would replay all the input since the last committed snapshot
    snapshot_failure_timeout: float = 300.0
    coordinator_niceness: int = COORDINATOR_NICENESS
    #: started spare stage actors (Ray): a recovery resets one in a lost instance's place
    #: instead of starting a process (~1 s of CPU); each costs an idle process's memory.
    #: None: one under recovery="local" without replicas (its replacement starts while the
    #: others work: a new process took up to twice global's time to first output), else none
    standbys: Optional[int] = None
    #: memory budget of each stateful step instance's cached states (see snapshots/state_cache.py);
    #: None: an eighth of its node's memory over the node's cores, at least 256 MiB
    #: (snapshots/memory_size.py, node_budget_bytes)
    state_cache_bytes: Optional[int] = None
    #: aligned sources: how far (in the sources' time units, ms for Kafka) a partition may emit
    #: past the slowest of its source's partitions; "auto": each source's own (Kafka: 2 ms, an
    #: in-memory source: off); None: each source instance reads at its own pace
    #: (see engine/connectors/alignment.py)
    source_alignment: Any = DEFAULT_SOURCE_ALIGNMENT
    #: each stage instance merges its senders' batches in t order, holding a sender that runs
    #: ahead of another (see ordering/input_merge.py), and a source instance its partitions'
    #: records (connectors/source_reader.py); False: batches and reads are taken as they come
    input_merge: bool = True
    #: at parallelism 1, run the whole flow in one stage actor: a ``key_by`` computes its key
    #: in its input's stage, no data plane between them (see model/plan.py); False: the
    #: layout of every other parallelism, a stage per key_by
    fuse: bool = True
    #: the run's figures as Ray metrics (Prometheus, the dashboard), recorded every
    #: ``metrics_interval`` seconds from the coordinator; only where Ray collects metrics
    #: (see engine/control/metrics_export.py)
    export_metrics: bool = True
    metrics_interval: float = METRICS_INTERVAL_S
    #: TLS on the connections between the run's actors (and to the coordinator's snapshot
    #: inbox), beside the challenge-response every connection makes: a DataPlaneTLS or a
    #: dict with ``ca``, ``cert`` and ``key`` (PEM files at the same paths on every node);
    #: None: plain TCP (see engine/model/data_plane.py)
    data_plane_tls: Optional[DataPlaneTLS] = None
    #: the file each actor derives the run's data-plane secret from (the secret never
    #: crosses Ray, see engine/model/data_plane.py): at least 32 secret bytes, mode 0600,
    #: at the same path on every node; None: this user's ``data-plane.key`` in its private
    #: data directory, made by the launch on its node (one machine, or a shared home)
    data_plane_key: Optional[str] = None
    #: how a failure is recovered: "global", every instance rolls back to the newest snapshot
    #: and the sources replay; "local", only the failed instance restores it and has its
    #: inputs re-sent from its senders' logs, the others go on (issue 58; on Ray one dead stage
    #: instance, else a global rollback that says why; see docs/architecture.md, "Local recovery")
    recovery: str = "global"
    #: copies of a stage instance, all fed the same input (issue 58): the receivers take one's
    #: output and a replica's death costs no restore; needs recovery="local". An int r: every
    #: stage that reads no source runs as r replicas; a mapping {step name: r}: the stages
    #: holding a named step run as its r, every other stage as one instance (its failures
    #: recover as without replicas); see RunConfig.replicated and docs/architecture.md,
    #: "Local recovery and replicas"
    replicas: Union[int, Mapping[str, int]] = 1
    #: what the receivers check of the replicas' output: "first" (crash faults: the primary's
    #: stream, a live replica's once it dies) or "majority" (replicas >= 2: the sinks take an epoch
    #: once most replicas' digests agree; with 2 a mismatch rolls back), "sample:N" (replicas >= 2:
    #: the sinks take the primary's output at once, one epoch in N is voted after it left: a
    #: corrupt primary's output may have left); all three run on Ray and in the simulator;
    #: or "reexecute:N" (silent corruption without a second copy: one keyed batch in N re-run on a
    #: copy of its keys' state, settled reads checked; a difference rolls the run back)
    verify: str = "first"
    #: where verify="reexecute:N" re-runs a batch on Ray: "process" (the instance's own) or
    #: "verifier" (another process, the flow's verifier actor: a bad core does not check itself;
    #: it costs more CPU, see docs/operations.md). The simulator re-runs in the instance's process.
    reexecute_on: str = "process"

    def __post_init__(self) -> None:
        object.__setattr__(self, "guarantee", Guarantee.parse(self.guarantee))
        object.__setattr__(self, "faults", {k: tuple(v) for k, v in dict(self.faults or {}).items()})
        if type(self.coordinator_niceness) is not int or not 0 <= self.coordinator_niceness <= 19:
            raise FlowError(f"coordinator_niceness is an int from 0 (the data path's priority) to 19, not {self.coordinator_niceness!r}")
        if self.standbys is not None and (type(self.standbys) is not int or self.standbys < 0):
            raise FlowError(f"standbys is an int >= 0 (spare actors that replace a lost one) or None (the recovery's own), "
                            f"not {self.standbys!r}")
        for name in ("batch_size", "max_inflight"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise FlowError(f"{name} is a positive int, not {value!r}")
        if type(self.export_metrics) is not bool:
            raise FlowError(f"export_metrics is True or False, not {self.export_metrics!r}")
        for name in ("snapshot_interval", "heartbeat_timeout", "snapshot_timeout", "snapshot_failure_timeout", "metrics_interval"):
            if not getattr(self, name) > 0:
                raise FlowError(f"{name} is a positive number of seconds, not {getattr(self, name)!r}")
        if self.state_cache_bytes is not None and (type(self.state_cache_bytes) is not int or self.state_cache_bytes < 1):
            raise FlowError(f"state_cache_bytes is a positive int (bytes per stateful step instance) or None (a share of "
                            f"the node's memory), not {self.state_cache_bytes!r}")
        for name in ("resume", "fresh", "allow_state_changes", "allow_new_partitions", "keep_parallelism", "input_merge", "fuse"):
            if type(getattr(self, name)) is not bool:
                raise FlowError(f"{name} is True or False, not {getattr(self, name)!r}")
        if self.resume and self.fresh:
            raise FlowError("resume=True and fresh=True contradict each other: resume continues from the newest snapshot, "
                            "fresh discards the snapshots; choose one")
        a = self.source_alignment
        if a is not None and a != AUTO_ALIGNMENT and (isinstance(a, bool) or not isinstance(a, (int, float)) or a < 0):
            raise FlowError(f"source_alignment is a number >= 0 (how far past the slowest source partition, in its time "
                            f"units, a partition may read), 'auto' (each source's own) or None, not {a!r}")
        if isinstance(self.data_plane_tls, Mapping):
            object.__setattr__(self, "data_plane_tls", DataPlaneTLS(**self.data_plane_tls))
        if self.data_plane_tls is not None:
            if not isinstance(self.data_plane_tls, DataPlaneTLS):
                raise FlowError(f"data_plane_tls is a DataPlaneTLS(ca, cert, key) or a dict of those, not {self.data_plane_tls!r}")
            self.data_plane_tls.check()
        if self.data_plane_key is not None and not isinstance(self.data_plane_key, str):
            raise FlowError(f"data_plane_key is the path of a key file (at the same path on every node), not {self.data_plane_key!r}")
        if type(self.sample_every) is not int or self.sample_every < 1:
            raise FlowError(f"sample_every is a positive int, not {self.sample_every!r}")
        if self.recovery not in RECOVERY_MODES:
            raise FlowError(f"recovery is 'global' (every instance rolls back to the newest snapshot) or 'local' (only the "
                            f"failed instance restores), not {self.recovery!r}")
        self._check_replicas()

    def _check_replicas(self) -> None:
        if isinstance(self.replicas, Mapping):
            object.__setattr__(self, "replicas", dict(self.replicas))
            for step, r in self.replicas.items():
                if type(r) is not int or r < 1:
                    raise FlowError(f"replicas[{step!r}] is an int >= 1 (copies of the stage holding step {step!r}), not {r!r}")
            if not self.replicas:
                raise FlowError("replicas={} names no step: give an int (every stage that reads no source) or {step name: r}")
        elif type(self.replicas) is not int or self.replicas < 1:
            raise FlowError(f"replicas is an int >= 1 (copies of each stage instance that reads no source) or a mapping "
                            f"{{step name: r}} (copies of the stages holding those steps), not {self.replicas!r}")
        if self.verify not in VERIFY_MODES and reexecute_every(self.verify) is None and vote_sample(self.verify) is None:
            raise FlowError(f"verify is 'first' (take the first replica's output; crash faults), 'majority' (release what "
                            f"most replicas agree on; replicas >= 2), 'sample:N' (release the primary's output at once, vote on "
                            f"one epoch in N after; replicas >= 2) or 'reexecute:N' (one keyed batch in N re-run on a copy), "
                            f"not {self.verify!r}")
        if self.replica_count > 1 and self.recovery != "local":
            raise FlowError("replicas build on local recovery (a dead primary's receivers switch to a live replica at the "
                            "watermark): set recovery='local' with replicas > 1")
        if self.verify == "majority" and self.replica_count < 2:
            raise FlowError("verify='majority' needs replicas >= 2 (3 or more to outvote a corrupt replica; with 2 a mismatch "
                            "rolls back to a snapshot both agreed on)")
        if self.reexecute_on not in REEXECUTE_PLACES:
            raise FlowError(f"reexecute_on is 'verifier' (verify='reexecute:N' re-runs a batch in the flow's verifier "
                            f"process) or 'process' (in the instance's own), not {self.reexecute_on!r}")
        if vote_sample(self.verify) is not None and self.replica_count < 2:
            raise FlowError(f"verify={self.verify!r} needs replicas >= 2 (it compares the replicas' digests of one epoch in N; "
                            "with replicas=1 take verify='reexecute:N')")

    @classmethod
    def from_options(cls, **options: Any) -> "RunConfig":
        """The config of ``Flow.run(**options)`` / ``Flow.start(**options)``; unknown names fail."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in options:
            if key not in names:
                listed = sorted(names - INTERNAL_OPTIONS)
                close = difflib.get_close_matches(key, listed, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise FlowError(f"unknown run option {key!r}; {hint}the options are: {', '.join(listed)}")
        return cls(**options)

    @property
    def standby_count(self) -> int:
        """How many standbys the run keeps: ``standbys``, or when None the recovery's own
        (one under recovery="local" without replicas, else none).

        >>> RunConfig().standby_count, RunConfig(recovery="local").standby_count, RunConfig(recovery="local", standbys=0).standby_count
        (0, 1, 0)
        """
        if self.standbys is not None:
            return self.standbys
        return 1 if self.recovery == "local" and self.replica_count == 1 else 0

    @property
    def replica_count(self) -> int:
        """The most replicas a stage instance runs as (1: the run has none): the int, or the
        mapping's largest r."""
        return max(self.replicas.values()) if isinstance(self.replicas, dict) else self.replicas

    def replicas_of(self, plan: Any, stage: int) -> int:
        """How many replicas each instance of ``plan``'s stage ``stage`` runs as (1: none)."""
        return self.replicated(plan).get(Instance(stage, 0), 1)

    def replicated(self, plan: Any) -> dict:
        """The instances of ``plan`` that run as replicas, each with its r (>= 2); a FlowError
        that says how to fix ``replicas`` if it does not fit ``plan``. O(steps + instances).

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("r"); f.source(MemorySource([1]), name="src").key_by(str).count(name="c").key_by(str).count(name="d").sink(MemorySink("o"))
        >>> c = RunConfig(recovery="local", replicas={"c": 2, "d": 3}); c.replicated(f.plan(1, fuse=False)), c.replicas_of(f.plan(1, fuse=False), 1)
        ({Instance(stage=1, index=0): 2, Instance(stage=2, index=0): 3}, 2)
        >>> RunConfig(recovery="local", replicas={"c": 2}).replicated(f.plan(1))
        Traceback (most recent call last):
        driftstream.engine.model.errors.FlowError: replicas names step 'c' of a source stage: sources have no replicas (their input is replayed); name a step after a key_by (at parallelism 1 a key_by runs in its input's stage: fuse=False keeps a stage per key_by)
        """
        if not isinstance(self.replicas, dict):
            return {} if self.replicas == 1 else {k: self.replicas for k in plan.instances if k not in plan.source_instances}
        stage_of = {s.name: plan.stage_of[s.id] for s in plan.steps}
        named: dict = {}
        for step, r in self.replicas.items():
            if step not in stage_of:
                raise FlowError(f"replicas names step {step!r}, which flow {plan.flow_name!r} does not have; its steps: "
                                f"{', '.join(sorted(stage_of))}")
            stage = plan.stages[stage_of[step]]
            if stage.source_id >= 0:
                fused = " (at parallelism 1 a key_by runs in its input's stage: fuse=False keeps a stage per key_by)" if plan.fused else ""
                raise FlowError(f"replicas names step {step!r} of a source stage: sources have no replicas (their input "
                                f"is replayed); name a step after a key_by{fused}")
            other = named.setdefault(stage.index, (step, r))
            if other[1] != r:
                raise FlowError(f"replicas names steps {other[0]!r} (r={other[1]}) and {step!r} (r={r}) of one stage: a "
                                f"stage runs as one number of replicas; give both the same r")
        if self.verify == "majority":
            _refuse_unvoted_sinks(plan, {i: step for i, (step, r) in named.items() if r > 1})
        return {k: named[k.stage][1] for k in plan.instances if k.stage in named and named[k.stage][1] > 1}

    def refuse_rescale(self, plan: Any) -> None:
        """A FlowError, before anything stops, if a run with replicas cannot go on as one at
        ``plan`` (the parallelism a rescale moves to): its ``replicas`` mapping does not fit
        ``plan``, or no instance of ``plan`` would have replicas. Nothing without replicas. (Under
        ``"sample:N"`` the rescale's snapshot is one a vote certifies: see rescaler.py.)

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("r"); f.source(MemorySource([1]), name="src").key_by(str).count(name="c").sink(MemorySink("o"))
        >>> RunConfig(recovery="local", replicas=2).refuse_rescale(f.plan(3))
        >>> RunConfig(recovery="local", replicas=2).refuse_rescale(f.plan(1))
        Traceback (most recent call last):
        driftstream.engine.model.errors.FlowError: a rescale of flow 'r' to parallelism 1 would leave it without replicas: at parallelism 1 a key_by runs in its input's stage, which reads a source (sources have no replicas); rescale to 2 or more, or start the flow with fuse=False (a stage per key_by)
        >>> RunConfig(recovery="local", replicas=2, verify="sample:2").refuse_rescale(f.plan(3))
        """
        if self.replica_count > 1 and not self.replicated(plan):
            fused = (" at parallelism 1 a key_by runs in its input's stage, which reads a source (sources have no replicas); "
                     "rescale to 2 or more, or start the flow with fuse=False (a stage per key_by)") if plan.fused else \
                    " every stage of it reads a source (sources have no replicas)"
            raise FlowError(f"a rescale of flow {plan.flow_name!r} to parallelism {plan.parallelism} would leave it without replicas:{fused}")

    @property
    def takes_snapshots(self) -> bool:
        return self.guarantee is not Guarantee.NONE

    def resumed(self) -> "RunConfig":
        """The same run, continuing from the newest snapshot (a new coordinator after one died)."""
        return dataclasses.replace(self, resume=True, fresh=False, keep_parallelism=True)

    def not_defaults(self, *allowed: str) -> list:
        """Names of the options set to something other than their default, except ``allowed``."""
        default = RunConfig()
        return [f.name for f in dataclasses.fields(self) if f.name not in allowed and getattr(self, f.name) != getattr(default, f.name)]


class RunOptions(TypedDict, total=False):
    """The keyword options of ``Flow.run`` / ``Flow.start`` (``**options: Unpack[RunOptions]``),
    typed for checkers and editors: the public fields of :class:`RunConfig`, which documents
    each and holds its default (a test keeps the two alike); where RunConfig normalises what
    it is given (a guarantee's name, a dict of TLS files), the wider type it accepts. The
    engine's test hooks (:data:`INTERNAL_OPTIONS`) are not among them."""

    seed: Optional[int]
    batch_size: Optional[int]
    max_inflight: Optional[int]
    chaos: Optional[float]
    sample_every: int
    guarantee: Union[Guarantee, str]
    snapshot_interval: float
    snapshot_dir: Optional[str]
    resume: bool
    fresh: bool
    allow_state_changes: bool
    allow_new_partitions: bool
    heartbeat_timeout: float
    snapshot_timeout: float
    snapshot_failure_timeout: float
    coordinator_niceness: int
    standbys: Optional[int]
    state_cache_bytes: Optional[int]
    source_alignment: Any
    input_merge: bool
    fuse: bool
    export_metrics: bool
    metrics_interval: float
    data_plane_tls: Union[DataPlaneTLS, Mapping[str, str], None]
    data_plane_key: Optional[str]
    recovery: str
    replicas: Union[int, Mapping[str, int]]
    verify: str
    reexecute_on: str


@dataclass(frozen=True)
class InstanceConfig:
    """What one stage actor is started (or reset) with."""

    batch_size: int = 256
    max_inflight: int = 2_000
    chaos: Optional[float] = None
    sample_every: int = 1
    seed: Optional[int] = None
    snapshot_dir: Optional[str] = None
    state_cache_bytes: Optional[int] = None  # None: node_budget_bytes() where the instance runs
    skip_released: bool = False  # exactly-once / at-most-once recovery: drop what the sinks hold
    source_alignment: Any = None  # aligned sources' slack (RunConfig.source_alignment)
    input_merge: bool = True  # RunConfig.input_merge
    restore: SnapshotPart = field(default_factory=SnapshotPart)  # its part of the manifest it starts from
    restore_t: Optional[tuple] = None  # that manifest's watermark (None: from the beginning)
    recovering: bool = False  # a restart after a failure (or a resume): output logs are replayed, also from the beginning
    incarnations: Optional[dict] = None  # recovery="local": every instance's incarnation (None: the default path)
    reexecute: Optional[int] = None  # verify="reexecute:N": N (None: the default path)
    #: verify="reexecute:N" on another process: the flow's verifier actor (None: in the instance's own)
    verifier: Any = None
    #: replicas > 1: replicated instance -> its live replicas' incarnations, the primary first (None: the default path)
    replica_sets: Optional[dict] = None
    #: replicas > 1, a replica that is not the primary: ``(its incarnation, its actor name)``
    replica: Optional[tuple] = None
    votes: bool = False  # verify="majority": the replicas digest their epochs and the primaries' sinks wait for the votes
    sample: Optional[int] = None  # verify="sample:N" (with votes): N, one epoch in N voted after its output left, no gate
