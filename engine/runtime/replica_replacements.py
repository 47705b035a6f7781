"""A replacement replica in the simulator (issue 58, design item 4): an instance that lost a
replica (a death, or a dissenter removed by the votes, see simulated_votes.py) gets a new one, back to
``replicas`` copies, as local recovery replaces a failed instance (local_recovery.py):

1. It restores the newest committed snapshot the votes certified (``T``; a snapshot they
   have not certified may hold a corrupt primary's state), its sinks dropping nothing (it
   writes none; its releases are digested, from ``T`` on).
2. Under a hold at ``T`` each, the senders whose stream the instance's replicas take (the
   upstream primaries and unreplicated instances) re-send from their logs what they sent the
   instance since ``T``, to the new replica's channels alone, then their ReplaySent. The logs
   keep what is at or after the certified snapshot (the run trims them there, not at the
   newest commit).
3. Until it catches up it is told the acker's raw frontier, not the watermarks (they would
   fold its state before its replay lands), and no snapshot begins; then it is a replica as
   any other. It votes from the epoch open at its start (it sees that one whole).

Restoring the certified snapshot reuses what a local recovery does (restore, logs, holds,
catch-up); taking a live replica's state instead would need a copy of a running instance's
backends, which nothing does yet.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any, Optional

from driftstream.ordering.meta import BOTTOM, TOP

from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.recovery import RecoveryRules
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.instance_host import ACKER
from driftstream.engine.runtime.instance_recovery import catch_up
from driftstream.engine.runtime.protocol import ReplaySent
from driftstream.engine.runtime.replicas import address


class ReplicaReplacements:
    """The replacements of a run's replicas (``replicas``: its
    :class:`~.simulated_replicas.SimulatedReplicas`): ``catching_up`` (incarnation -> the
    frontier it was told), ``started``: ``(instance, incarnation, snapshot id)`` of each."""

    def __init__(self, replicas: Any) -> None:
        self.replicas = replicas
        self.catching_up: dict = {}
        self.started: list = []

    def replace(self, plan: Plan, instance: Instance, store: Any, rules: RecoveryRules, rng: random.Random, base_every_s: float) -> str:
        """A new replica of ``instance`` from the newest snapshot the votes certified (in
        ``store``; under ``verify="first"`` the newest committed; the run's ``rules`` make its
        config); says what was done."""
        votes = self.replicas.votes
        if votes is not None:
            _, sid = votes.rollback_target()
            data = None if sid is None else store.read_manifest(sid)
        else:
            data = store.read_latest_manifest()
            sid = None if data is None else Manifest.from_json(data).snapshot_id
        if sid is not None and data is None:  # the logs hold what follows it alone: no older one will do
            return f"not replaced (certified snapshot {sid} pruned)"
        manifest = None if data is None else Manifest.from_json(data)
        config = rules.instance_config(instance, plan.instances.index(instance), manifest, recovering=True)
        inc = self._start(plan, instance, config, sid, rng, base_every_s, rules.settings["batch_size"])
        return f"replaced by replica {inc} from " + ("the beginning" if sid is None else f"snapshot {sid}")

    def _start(self, plan: Plan, instance: Instance, config: InstanceConfig, snapshot_id: Optional[int], rng: random.Random,
               base_every_s: float, batch_size: int) -> Any:
        """Start the replacement from ``config`` and have its senders re-send; its incarnation."""
        replicas = self.replicas
        local, live, incarnation = replicas.local, replicas.live, replicas.incarnation
        inc = local.new_incarnation()
        scratch = os.path.join(live.scratch, f"replica-{inc}")
        os.makedirs(scratch, exist_ok=True)
        host = live.host(plan, instance, dataclasses.replace(config, skip_released=False), rng.getrandbits(32), base_every_s,
                         replicas._bundle_writer(instance, inc), replicas._sender(inc), scratch, incarnations=local.incarnations, incarnation=inc)
        host.recovery.cut = TOP  # its output dropped, but logged
        replicas.sets[instance].append(inc)
        replicas.hosts[inc] = (instance, host)
        if host.output_logs is not None:  # steps declared deterministic=False: it takes the primary's draws (replica_draws.py)
            host.draws = replicas.draws(instance, inc, host, False)
            replicas.hosts[replicas.sets[instance][0]][1].draws.sync(address(inc))
        if replicas.votes is not None:
            replicas.votes.started(instance, inc, host, first=len(replicas.votes.epochs.boundaries))
        seed = host.rt.take_seed()
        if seed:
            incarnation.acker.seed(host.recovery.tag(seed))
        t = BOTTOM if config.restore_t is None else config.restore_t
        self.catching_up[inc] = BOTTOM
        table = incarnation.acker.table
        for key, sender in list(live.hosts.items()):
            if key == instance:
                continue
            token = address(replicas.sets[key][0]) if key in replicas.sets else key
            table.hold((inc, token), t)
            part = sender.recovery
            for _, batch in part.replay(sender.rt, instance, inc, batch_size, since=t):
                incarnation.data.append((*instance, batch))
            sender.flush()
            incarnation.send_control(token, ACKER, ReplaySent(inc, token))
        self.started.append((instance, inc, snapshot_id))
        return inc

    def catch_up(self) -> None:
        """Tell each replacement catching up the raw frontier if it moved (a scheduling step's
        start: the acker's side); one that met the watermark, with no replay pending, caught up."""
        incarnation = self.replicas.incarnation
        send = lambda inc, message: incarnation.enqueue(ACKER, address(inc), message)  # noqa: E731
        catch_up(incarnation.acker.table, self.catching_up, {inc: inc for inc in self.catching_up}, incarnation.acker.pushed, send)

    def lost(self, inc: Any) -> None:
        self.catching_up.pop(inc, None)
