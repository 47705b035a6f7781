"""Compile a flow graph into stages: fused operator chains between shuffles.

A new stage starts at every source, every ``key_by`` (the shuffle) and every
``merge`` whose inputs live in different stages. All other steps run in the
actor of their input, like Flink's operator chaining. An edge between two
stages is a channel: keyed (to a key_by: by stable hash of the key) or
forward (instance i to instance i).

At parallelism 1 a shuffle moves nothing (one instance owns every key group), so a
``key_by`` stays in its input's stage (``fuse``, the default): it computes its key there
and the steps after it run in the same actor, called directly, with no data plane
between them. ``fuse=False`` keeps the layout of every other parallelism.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("p"); f.source(MemorySource([1]), name="src").key_by(str, name="k").count(name="n").sink(MemorySink("o"))
>>> [s.steps for s in f.plan(1).stages], [s.steps for s in f.plan(1, fuse=False).stages]
([['src', 'k', 'n', 'o']], [['src'], ['k', 'n', 'o']])
>>> [len(f.plan(1).with_parallelism(n).stages) for n in (2, 1)]    # the layout follows the parallelism
[2, 1]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional

from driftstream.ordering.key_groups import GroupRange, KeyGroups, check_parallelism
from driftstream.ordering.receiver_frontiers import Cones

from driftstream.engine.model.errors import FlowError

class Instance(NamedTuple):
    """One instance of a stage: the stage's index in the plan and the instance's index in it."""

    stage: int
    index: int

    @property
    def label(self) -> str:
        """The instance's name in manifests and logs: ``"stage/index"``."""
        return f"{self.stage}/{self.index}"


@dataclass
class StagePlan:
    """One stage: its steps (by name, in topological order) and one actor per instance."""

    index: int
    name: str
    step_ids: list
    steps: list
    parallelism: int
    actor_names: list
    #: step ids that receive batches from other stages
    entries: list = field(default_factory=list)
    #: step id of the stage's source, or -1
    source_id: int = -1


@dataclass
class Channel:
    """An edge between stages: from step ``src`` to step ``dst`` (the entry of stage ``dst_stage``)."""

    src: int
    dst: int
    dst_stage: int
    keyed: bool
    #: for an edge into a merge: the input's position, appended to child_ids
    tag: Optional[int] = None


@dataclass
class Plan:
    """What runs where. ``describe()`` is the human view; runtimes read the rest."""

    flow_name: str
    parallelism: int
    steps: list
    stages: list
    stage_of: dict
    successors: dict  # step id -> list of (step id in the same stage, merge tag or None)
    channels: dict  # step id -> list of Channel out of it
    #: the flow's key groups: a key's group and, at ``parallelism``, its instance
    key_groups: KeyGroups = field(default_factory=KeyGroups)
    #: whether a ``key_by`` at parallelism 1 stays in its input's stage (see the module doc)
    fuse: bool = True

    def fused_key_by(self, step_id: int) -> bool:
        """Whether step ``step_id`` is a ``key_by`` in its input's stage: it computes its key
        there, no channel routes into it."""
        step = self.steps[step_id]
        return step.kind.shuffles and self.stage_of[step.inputs[0]] == self.stage_of[step_id]

    @property
    def fused(self) -> bool:
        """Whether a ``key_by`` runs in its input's stage (its key computed there, no shuffle)."""
        return any(self.fused_key_by(s.id) for s in self.steps)

    @property
    def max_parallelism(self) -> int:
        return self.key_groups.max_parallelism

    @property
    def stateful_steps(self) -> list:
        """Names of the steps that keep keyed state (what a snapshot holds state for), in order."""
        return [s.name for s in self.steps if s.kind.stateful]

    @property
    def logged_steps(self) -> list:
        """Names of the steps declared ``deterministic=False``, whose outputs are logged and
        replayed (see engine/runtime/logged_step.py), in order."""
        return [s.name for s in self.steps if not s.deterministic]

    @property
    def keyed_stages(self) -> list:
        """The stages their input reaches through a ``key_by``, or holding one (their instances own key groups)."""
        keyed = {ch.dst_stage for chans in self.channels.values() for ch in chans if ch.keyed}
        keyed |= {self.stage_of[s.id] for s in self.steps if s.kind.shuffles}
        return [s for s in self.stages if s.index in keyed]

    def keyed_names(self, stage: StagePlan) -> list:
        """What ``status()`` lists keyed ``stage``'s key groups under: its name (a shuffle enters
        it, and it is named after that key_by), or the names of the key_bys fused into it."""
        fused = [self.steps[i].name for i in stage.step_ids if self.fused_key_by(i)]
        return fused or [stage.name]

    def key_group_range(self, instance: Instance) -> GroupRange:
        """The key groups ``instance`` owns (its stage is keyed) or would own."""
        return self.key_groups.range_of(instance.index, self.stages[instance.stage].parallelism)

    def with_key_hash(self, key_hash: int) -> "Plan":
        """The same flow with its keys hashed to groups by ``key_hash`` (a snapshot's: its
        state is stored under those groups), see :data:`~driftstream.ordering.key_groups.KEY_HASH`."""
        return replace(self, key_groups=KeyGroups(self.max_parallelism, key_hash))

    def with_parallelism(self, parallelism: int) -> "Plan":
        """The same flow at another parallelism: stages, actor names and routing follow.

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("p"); f.source(MemorySource([1])).key_by(str, name="k").sink(MemorySink("o"))
        >>> f.plan(2).with_parallelism(3).stages[1].actor_names
        ['p/k/0', 'p/k/1', 'p/k/2']
        """
        _check_parallelism(parallelism, self.max_parallelism)
        stages, stage_of, successors, channels = _layout(self.flow_name, self.steps, parallelism, self.fuse)
        return replace(self, parallelism=parallelism, stages=stages, stage_of=stage_of, successors=successors, channels=channels)

    def unfused(self) -> "Plan":
        """The same flow with a stage per ``key_by`` at any parallelism (``fuse=False``): the
        layout of every snapshot written before fused plans."""
        return replace(self, fuse=False).with_parallelism(self.parallelism)

    @property
    def source_instances(self) -> list:
        """Every source :class:`Instance`; its position is its acker index."""
        return [Instance(s.index, i) for s in self.stages if s.source_id >= 0 for i in range(s.parallelism)]

    @property
    def source_groups(self) -> list:
        """Per source instance (by acker index): the acker indexes of its source's instances,
        the group whose frontier it aligns to (another source may run on another clock)."""
        groups: dict = {}
        for i, inst in enumerate(self.source_instances):
            groups.setdefault(inst.stage, []).append(i)
        return [tuple(groups[inst.stage]) for inst in self.source_instances]

    @property
    def instances(self) -> list:
        """Every stage :class:`Instance`, stage by stage."""
        return [Instance(s.index, i) for s in self.stages for i in range(s.parallelism)]

    def cones(self) -> Cones:
        """Each instance's upstream cone and downstream (``recovery="local"``: a frontier per
        receiver, ordering/receiver_frontiers.py): a keyed channel reaches every instance of
        its stage, a forward one the instance of the same index. O(instances x channels).

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("c"); f.source(MemorySource([1], partitions=2)).key_by(str).count().sink(MemorySink("o"))
        >>> sorted(f.plan(2).cones().upstream[Instance(1, 0)])
        [Instance(stage=0, index=0), Instance(stage=0, index=1), Instance(stage=1, index=0)]
        """
        receivers: dict = {}
        for key in self.instances:
            to = receivers[key] = set()
            for sid in self.stages[key.stage].step_ids:
                for ch in self.channels[sid]:
                    if ch.keyed:
                        to.update(Instance(ch.dst_stage, i) for i in range(self.stages[ch.dst_stage].parallelism))
                    else:
                        to.add(Instance(ch.dst_stage, key.index))
        return Cones(receivers)

    def receivers_of(self, stage: int) -> set:
        """The stages that ``stage``'s channels reach. O(its channels).

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("r"); f.source(MemorySource([1], partitions=2)).key_by(str).count().sink(MemorySink("o"))
        >>> p = f.plan(2); p.receivers_of(0), p.receivers_of(1)
        ({1}, set())
        """
        return {ch.dst_stage for sid in self.stages[stage].step_ids for ch in self.channels[sid]}

    def actor_name(self, instance: Instance) -> str:
        """The Ray name of ``instance``'s actor: ``flow/stage/index``."""
        return self.stages[instance.stage].actor_names[instance.index]

    def participant(self, instance: Instance) -> str:
        """``instance``'s name in the snapshot store, where '/' cannot be: ``flow-stage-index``."""
        return f"{self.stage_participant(instance.stage)}-{instance.index}"

    def stage_participant(self, stage: int) -> str:
        """The participant names of stage ``stage``'s instances without their index: ``flow-stage``."""
        return f"{self.flow_name}-{self.stages[stage].name}"

    def describe(self) -> str:
        """The stages, their steps and actors; a stage whose ``key_by`` runs in it says ``(fused)``,
        a step declared ``deterministic=False`` ``(logged)``.

        >>> from driftstream.engine import Flow
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("p"); f.source(MemorySource([1]), name="src").key_by(str, name="k").sink(MemorySink("o"))
        >>> print(f.plan(1).describe())
        flow 'p', parallelism 1
          stage src (fused): src -> k -> o
            actors: p/src/0
        """
        lines = [f"flow {self.flow_name!r}, parallelism {self.parallelism}"]
        fused = {self.stage_of[s.id] for s in self.steps if self.fused_key_by(s.id)}
        for s in self.stages:
            names = [f"{self.steps[i].name} (logged)" if not self.steps[i].deterministic else self.steps[i].name for i in s.step_ids]
            lines.append(f"  stage {s.name}{' (fused)' if s.index in fused else ''}: {' -> '.join(names)}")
            lines.append(f"    actors: {', '.join(s.actor_names)}")
        return "\n".join(lines)


def compile_plan(flow, parallelism: int, fuse: bool = True) -> Plan:
    """Validate ``flow`` and split it into stages (``fuse``: see the module doc); raises FlowError with a fix."""
    if not isinstance(parallelism, int) or parallelism < 1:
        raise FlowError(f"parallelism must be an int >= 1, got {parallelism!r}")
    key_groups = KeyGroups(getattr(flow, "max_parallelism", None) or KeyGroups().max_parallelism)
    _check_parallelism(parallelism, key_groups.max_parallelism)
    flow.validate()
    steps = flow.steps_to_run()
    stages, stage_of, successors, channels = _layout(flow.name, steps, parallelism, fuse)
    for step in steps:
        if step.kind.is_sink and (successors[step.id] or channels[step.id]):
            raise FlowError(f"step {step.name!r}: nothing can follow a sink")
        if step.kind.is_sink and not steps[step.inputs[0]].kind.shuffles and step.sink.partition_key(key_groups.max_parallelism) is not None:
            # Stream.sink puts the shuffle there: without it two instances would write one part
            raise FlowError(f"sink {step.name!r} routes its input by partition (e.g. KafkaSink key=): add it with "
                            f"stream.sink(...), which puts the shuffle before it")
    reaches_sink = _reaching_sink(steps, successors, channels)
    for step in steps:
        if step.kind.is_source and step.id not in reaches_sink:
            raise FlowError(f"source {step.name!r} reaches no sink: end its stream with .sink(...)")
    return Plan(flow.name, parallelism, steps, stages, stage_of, successors, channels, key_groups, fuse)


def _layout(flow_name: str, steps: list, parallelism: int, fuse: bool) -> tuple:
    """``(stages, stage_of, successors, channels)`` of ``steps`` at ``parallelism``. O(steps + edges)."""
    stage_of: dict = {}
    stages: list = []
    # At parallelism 1 every key group has one owner: a key_by moves nothing between instances.
    fusing = fuse and parallelism == 1

    def new_stage(step) -> int:
        idx = len(stages)
        stages.append(StagePlan(idx, step.name, [], [], parallelism, [f"{flow_name}/{step.name}/{i}" for i in range(parallelism)]))
        return idx

    for step in steps:  # steps are created after their inputs: already topological
        if step.kind.is_source or (step.kind.shuffles and not fusing):
            st = new_stage(step)
        elif step.kind.merges:
            homes = {stage_of[i] for i in step.inputs}
            st = homes.pop() if len(homes) == 1 else new_stage(step)
        else:
            st = stage_of[step.inputs[0]]
        stage_of[step.id] = st
        stages[st].step_ids.append(step.id)
        stages[st].steps.append(step.name)
        if step.kind.is_source:
            stages[st].source_id = step.id

    successors: dict = {s.id: [] for s in steps}
    channels: dict = {s.id: [] for s in steps}
    for step in steps:
        for position, i in enumerate(step.inputs):
            # Two inputs of a merge may carry equal Metas (one element, two branches);
            # the input's position in child_ids keeps them apart and ordered.
            tag = position if step.kind.tagged_inputs else None
            if stage_of[i] == stage_of[step.id]:
                successors[i].append((step.id, tag))
            else:
                channels[i].append(Channel(i, step.id, stage_of[step.id], step.kind.shuffles, tag))
                if step.id not in stages[stage_of[step.id]].entries:
                    stages[stage_of[step.id]].entries.append(step.id)
    return stages, stage_of, successors, channels


def _check_parallelism(parallelism: int, max_parallelism: int) -> None:
    try:
        check_parallelism(parallelism, max_parallelism)
    except ValueError as exc:
        raise FlowError(str(exc)) from None


def _reaching_sink(steps: list, successors: dict, channels: dict) -> set:
    reach = {s.id for s in steps if s.kind.is_sink}
    for step in reversed(steps):
        nxt = [d for d, _ in successors[step.id]] + [c.dst for c in channels[step.id]]
        if any(n in reach for n in nxt):
            reach.add(step.id)
    return reach
