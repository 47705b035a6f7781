"""Starting the replicas of a run on Ray (``replicas=r``, ``verify="first"``; issue 58): every
stage instance that reads no source runs as ``r`` stage actors. The primary is the instance's
actor (``<flow>/<stage>/<i>``); the others are ``<flow>/<stage>/<i>/replica-<n>``, each with an
incarnation of its own, its output dropped but logged, its sinks' bundles kept
(runtime/replicas.py). The replicas of one instance are placed by a placement group whose
strategy is ``STRICT_SPREAD`` when the cluster has a node for each; else they share nodes and a
warning says so.

>>> replica_name("f/sum/0", 1)
'f/sum/0/replica-1'
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from driftstream.engine.model.config import RunConfig
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.actors import StageActor
from driftstream.engine.runtime.ray_session import NAMESPACE

log = logging.getLogger(__name__)

#: CPU a placement group's bundle asks for (a bundle cannot be empty; the actors ask none)
BUNDLE_CPU = 0.001
#: seconds to wait for a placement group before the replicas go without one
PLACEMENT_WAIT_S = 10.0


def replica_name(instance_name: str, n: int) -> str:
    """The actor name of replica ``n`` (>= 1) of instance ``instance_name`` (0 is the primary)."""
    return f"{instance_name}/replica-{n}"


@dataclasses.dataclass
class Replica:
    """A live replica: its incarnation, its name among the launcher's ``names``, its actor, and
    the name its peers know it by on the data plane (``me``: its name at its start)."""

    incarnation: int
    name: str
    handle: Any
    me: str = ""
    #: its data-plane address, once it listens
    where: Optional[tuple] = None

    def __post_init__(self) -> None:
        self.me = self.me or self.name


class ReplicaLaunch:
    """The replicas of the launcher's runs: ``sets`` (instance -> its live :class:`Replica` s,
    the primary first), the placement groups it made, and a serial for fresh names (a name
    stays taken while its promoted actor lives)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        #: instance -> how many replicas it runs as (RunConfig.replicated, set by number())
        self.counts: dict = {}
        self.sets: dict = {}
        self.groups: list = []
        #: instance -> a scheduling strategy per replica, the primary's first (None: Ray's choice)
        self.strategies: dict = {}
        self._serial: dict = {}

    def place(self, sets: dict, plan: Plan, first: bool) -> None:
        """The strategies of the replicas of ``sets``' instances: a placement group each at the
        run's first launch; a relaunch's new actors go where Ray puts them (a group cannot be
        removed while survivors run in it)."""
        self.strategies = {key: self._placement(plan.actor_name(key), len(incs)) if first else [None] * len(incs) for key, incs in sets.items()}

    def number(self, plan: Plan, incarnations: dict, next_incarnation: int) -> tuple:
        """Incarnations of every replicated instance's replicas: ``(replica_sets, next
        incarnation)``; ``replica_sets`` (instance -> incarnations, the primary's first) goes
        to every instance's config."""
        sets, self.counts = {}, self.config.replicated(plan)
        for key in plan.instances:
            if key in self.counts:
                sets[key] = [incarnations[key]] + list(range(next_incarnation, next_incarnation + self.counts[key] - 1))
                next_incarnation += self.counts[key] - 1
        return sets, next_incarnation

    def start(self, plan: Plan, configs: dict, sets: dict, primaries: dict, survivors: dict, plane: Any) -> list:
        """Start (or reset, ``survivors``: name -> handle) the replicas that are not the primary
        of each instance in ``sets``, from ``configs`` (instance -> its primary's config);
        ``primaries``: instance -> its primary's actor. Returns the reset calls' refs."""
        resets, self.sets = [], {}
        for key, incs in sets.items():
            strategies = self.strategies[key]
            primary = Replica(incs[0], plan.actor_name(key), primaries[key])
            self.sets[key] = [primary]
            for inc, strategy in zip(incs[1:], strategies[1:]):
                name = self._fresh_name(plan.actor_name(key), survivors)
                config = dataclasses.replace(configs[key], replica=(inc, name))
                if name in survivors:
                    handle = survivors[name]
                    resets.append(handle.reset.remote(config, plane, None, plan))
                else:
                    options = {"name": name, "namespace": NAMESPACE}
                    if strategy is not None:
                        options["scheduling_strategy"] = strategy
                    handle = StageActor.options(**options).remote(plan, *key, config, plane)
                self.sets[key].append(Replica(inc, name, handle))
        return resets

    def kept_by(self, plan: Plan) -> set:
        """The names of the live replicas that are not the primary which a launch of ``plan`` (a
        rescale's) resets in place: those of an instance ``plan`` has too (by its actor name), as
        many as ``plan`` replicates it with; :meth:`start` takes them back by name. The others
        (their instance gone, or a stage no longer replicated) are the caller's to kill."""
        counts = {plan.actor_name(k): r for k, r in self.config.replicated(plan).items()}
        return {r.name for rs in self.sets.values() for r in rs[1:counts.get(rs[0].name, 1)]}

    def fresh_name(self, instance_name: str) -> str:
        """A name for a new replica of instance ``instance_name`` that no live actor holds (a replacement's)."""
        return self._fresh_name(instance_name, {})

    def _fresh_name(self, instance_name: str, survivors: dict) -> str:
        """A surviving replica's name first (reset in place), else one no live actor holds."""
        for name in survivors:
            if name.startswith(instance_name + "/replica-") and not any(r.name == name for rs in self.sets.values() for r in rs):
                return name
        n = self._serial[instance_name] = self._serial.get(instance_name, 0) + 1
        return replica_name(instance_name, n)

    def _placement(self, instance_name: str, count: int) -> list:
        """A scheduling strategy per replica of one instance (the primary's first: None, it
        is placed with the others); STRICT_SPREAD over nodes when the cluster has enough."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) < count:
            log.warning("driftstream: the %d replicas of %s share a node: the cluster has %d alive node(s); "
                        "a node's loss kills them together", count, instance_name, len(nodes))
            return [None] * count
        group = placement_group([{"CPU": BUNDLE_CPU}] * count, strategy="STRICT_SPREAD")
        if not group.wait(PLACEMENT_WAIT_S):
            remove_placement_group(group)
            log.warning("driftstream: no STRICT_SPREAD placement for the replicas of %s within %.0f s: they may share a node",
                        instance_name, PLACEMENT_WAIT_S)
            return [None] * count
        self.groups.append(group)
        return [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(count)]

    def secondaries(self) -> list:
        """Every live :class:`Replica` that is not its instance's primary."""
        return [r for rs in self.sets.values() for r in rs[1:]]

    def wiring(self, addresses: Optional[dict] = None) -> tuple:
        """``(for the stage actors: incarnation -> (instance, address) of each replica that is
        not the primary, for the acker: instance -> [(incarnation, address)], the primary
        first)``; ``addresses`` (at a launch): an actor name's data-plane address."""
        if addresses is not None:
            for rs in self.sets.values():
                for r in rs:
                    r.where = addresses[r.name]
        stages = {r.incarnation: (tuple(k), r.where) for k, rs in self.sets.items() for r in rs[1:]}
        acker = {tuple(k): [(r.incarnation, r.where) for r in rs] for k, rs in self.sets.items()}
        return stages, acker

    def find(self, name: str) -> Optional[tuple]:
        """``(instance, index in its set)`` of the live replica named ``name`` (None: not one)."""
        for key, rs in self.sets.items():
            for n, r in enumerate(rs):
                if r.name == name:
                    return Instance(*key), n
        return None

    def holding(self, handle: Any) -> Optional[tuple]:
        """``(instance, Replica)`` of the live replica whose actor is ``handle`` (None: not one)."""
        for key, rs in self.sets.items():
            for r in rs:
                if r.handle is handle:
                    return Instance(*key), r
        return None

    def close(self) -> None:
        """Remove the placement groups (their actors are killed by the supervisor)."""
        for group in self.groups:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001  (already gone with the cluster)
                pass
        self.groups = []
