"""A replica's death on Ray (``replicas=r``, ``verify="first"``; issue 58, design item 4): no
restore, no rollback. The protocol is the simulator's (:mod:`driftstream.engine.runtime.
simulated_replicas`), over actor calls:

- a replica that was not the primary: the acker discards its tables
  (:meth:`AckerActor.replica_failed`), its senders drop it from their fan-out
  (:meth:`StageActor.replica_failed`); nothing else;
- the primary: the acker gives up the snapshot being collected, takes the cut ``W`` (its
  watermark) and holds it for every live instance and replica; each of them takes its part
  (the dead primary's queued batches dropped, what it sent at or above ``W`` cancelled, its
  batches for the instance to the next replica from now on); then the next replica is the
  primary (:meth:`StageActor.promote`): it writes what it kept that the sinks lack and sends
  again what it produced at or above ``W``.

The record's ``kind`` is ``"failover"`` or ``"replica lost"`` and it restores nothing
(``restored`` is empty, so ``metrics.restores`` counts none). What it cannot do is said by
:meth:`ReplicaFailover.refusal` and falls back to the supervisor's other recoveries. Then the
instance gets a new replica (:mod:`.replica_replacement`); until it joined, it runs on with one fewer.

>>> from driftstream.engine.model.plan import Instance
>>> a, b = Instance(1, 0), Instance(1, 1)
>>> ReplicaFailover.refusal_of({"f/a/0", "f/b/0/replica-1"}, {"f/a/0": (a, 0), "f/b/0/replica-1": (b, 1)}, {a: 2, b: 2}) is None
True
>>> ReplicaFailover.refusal_of({"f/a/0", "f/a/0/replica-1"}, {"f/a/0": (a, 0), "f/a/0/replica-1": (a, 1)}, {a: 2})
'1/0 lost its last live replica'
>>> ReplicaFailover.refusal_of({"f/src/0"}, {"f/src/0": None}, {})
'f/src/0 is not a replica (an instance without replicas: local recovery replaces it)'
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Optional

import ray

from driftstream.engine.control.failover import Failover, Recovery
from driftstream.engine.control.launcher import Launcher
from driftstream.engine.control.local_failover import acker_refusal
from driftstream.engine.control.replica_launch import Replica
from driftstream.engine.model.plan import Instance
from driftstream.engine.runtime.ray_session import kill_actors
from driftstream.engine.runtime.replicas import address

log = logging.getLogger(__name__)


class ReplicaFailover:
    """Answers the death of one replica of ``launcher``'s run (see the module doc); each
    record goes to ``failover.recoveries``. ``failovers``: primaries replaced by a replica."""

    def __init__(self, launcher: Launcher, failover: Failover) -> None:
        self.launcher, self.failover = launcher, failover
        self.failovers = self.lost = 0

    @staticmethod
    def refusal_of(dead: Optional[set], found: dict, live: dict) -> Optional[str]:
        """Why the death of ``dead`` (actor names) is not the replicas' to fail over (None: it
        is); ``found``: name -> ``(instance, index)`` among the replicas (None: not one),
        ``live``: instance -> its live replicas. Several may die at once (a node's loss), as long
        as each instance keeps one."""
        if not dead:
            return "every actor is restarted"
        others = sorted(n for n in dead if found.get(n) is None)
        if others and len(dead) == 1:
            return f"{others[0]} is not a replica (an instance without replicas: local recovery replaces it)"
        if others:
            return f"{len(dead)} actors died at once, not all replicas ({others[0]})"
        lost = Counter(found[n][0] for n in dead)
        for instance, n in sorted(lost.items()):
            if live[instance] <= n:
                return f"{instance.label} lost its last live replica"
        return None

    def fails_over(self, dead: set) -> bool:
        """Whether the replicas alone take over from ``dead`` (names): each a replica whose instance
        keeps a live one (:meth:`refusal_of`; the acker is not asked). A failure seen whole at once
        then: what dies after it (a node's loss seen in pieces) :meth:`recover` takes in turn."""
        return self._refusal_of(dead)[0] is None

    def refusal(self, dead: Optional[set]) -> Optional[str]:
        """:meth:`refusal_of`, then the acker's (a failover or a recovery under way, the run ending)."""
        why, found = self._refusal_of(dead)
        if why is not None:
            return why
        secondaries = all(found[n][1] > 0 for n in dead)  # (an outvoted one's exit may come as the run ends)
        return acker_refusal(self.launcher.acker.replica_refusal.remote((), secondaries))

    def _refusal_of(self, dead: Optional[set]) -> tuple:
        """``(`` :meth:`refusal_of` ``for the run's replicas now, each dead name's (instance, index) or None)``."""
        replicas = self.launcher.replicas
        found = {n: replicas.find(n) for n in dead or ()}
        return self.refusal_of(dead, found, {k: len(rs) for k, rs in replicas.sets.items()}), found

    def unreplicated(self, dead: Optional[set]) -> bool:
        """Whether ``dead`` is one stage instance without replicas (one that reads a source, or
        of a stage ``replicas={step: r}`` does not name): local recovery replaces it, its peers'
        replicas take their part too."""
        run = self.launcher
        if not dead or len(dead) != 1:
            return False
        name = next(iter(dead))
        return name in run.names[1:] and run.replicas.find(name) is None and run.plan.instances[run.names.index(name) - 1] not in run.replicas.sets

    def recover(self, dead: set, detected: float) -> list:
        """Fail over from the dead replicas ``dead`` (names; see the module doc), those that were not
        the primary first, then each primary once the failover before is whole. Returns the records."""
        run = self.launcher
        entered = time.time()
        sets = run.replicas.sets
        work = []
        for name in sorted(dead):
            victim, index = run.replicas.find(name)
            work.append((victim, sets[victim][index]))
        gone = [replica.handle for _, replica in work]
        kill_actors(gone, [])  # hung ones too
        records = []
        while work:
            work.sort(key=lambda w: sets[w[0]].index(w[1]) == 0)  # the secondaries first
            victim, replica = work.pop(0)
            if records and sets[victim].index(replica) == 0:
                self._settled(gone)
            record, died = self._one(victim, replica, gone, detected, entered)
            records.append(record)
            for handle, error in died:  # a peer that died meanwhile (a node's loss seen in pieces): in turn
                found = run.replicas.holding(handle)
                if found is None or len(sets[found[0]]) <= 1 + sum(v == found[0] for v, _ in work):
                    raise error  # not a replica, or its instance's last: the global rollback
                gone.append(handle)
                work.append(found)
        return records

    def _settled(self, gone: list, timeout: float = 5.0) -> None:
        """Wait until the acker holds nothing but for the dead (the failover before's re-sends are
        in): the next failover's cut must be past them."""
        ignore = [address(r.incarnation) for rs in self.launcher.replicas.sets.values() for r in rs if any(r.handle is g for g in gone)]
        deadline = time.time() + timeout
        while ray.get(self.launcher.acker.replica_refusal.remote(ignore)) is not None and time.time() < deadline:
            time.sleep(0.01)

    @staticmethod
    def _gather(calls: list) -> tuple:
        """``ray.get`` of each ``(handle, ref)``: ``(answers of the live, [(handle, error)] of those
        that died)``."""
        answers, died = [], []
        for handle, ref in calls:
            try:
                answers.append(ray.get(ref))
            except ray.exceptions.RayActorError as error:
                died.append((handle, error))
        return answers, died

    def _one(self, victim: Instance, dead: Replica, gone: list, detected: float, entered: float) -> tuple:
        """Fail over from the dead replica ``dead`` of ``victim``; ``gone``: every dead replica's actor.
        Returns the record and the peers found dead meanwhile, ``[(handle, error)]``."""
        run = self.launcher
        replicas = run.replicas.sets[victim]
        index = replicas.index(dead)
        replicas.pop(index)
        name = dead.me  # what its peers saw end (a promoted primary's is its replica name; a standby's, the instance's)
        killed = time.time()
        peers = [h for h in run.handles[1:] if not any(h is g for g in gone)]  # handles[0]: the acker
        if index:
            ray.get(run.acker.replica_failed.remote(tuple(victim), dead.incarnation, name, None))
            _, died = self._gather([(h, h.replica_failed.remote(tuple(victim), dead.incarnation, None, None, name)) for h in peers])
            self._dropped(dead.name)
            self.lost += 1
            kind, took = "replica lost", f"{victim.label} runs on with {len(replicas)} replica(s)"
            steps = {"confirm": entered - detected, "kill": killed - entered, "parts": time.time() - killed}
        else:
            new = replicas[0]
            tokens = [address(r.incarnation) for rs in run.replicas.sets.values() for r in rs if not any(r.handle is g for g in gone)]
            tokens += [k for k in run.plan.instances if k not in run.replicas.sets]
            cut = ray.get(run.acker.replica_failed.remote(tuple(victim), dead.incarnation, name, tokens, new.handle))
            others = [h for h in peers if h is not new.handle]
            parts, died = self._gather([(h, h.replica_failed.remote(tuple(victim), dead.incarnation, new.incarnation, cut, name)) for h in others])
            parted = time.time()
            promoted = ray.get(new.handle.promote.remote(dead.incarnation, cut, name))
            took = f"{new.name} is the primary of {victim.label} from t={cut} ({sum(p['cancelled'] for p in parts)} items cancelled, " \
                   f"{promoted['replayed']} re-sent)"
            steps = {"confirm": entered - detected, "kill": killed - entered, "parts": parted - killed, "promote": time.time() - parted}
            self._promoted(victim, new)
            self.failovers += 1
            kind = "failover"
        log.warning("driftstream: replica %s of %s died; %s", name, victim.label, took)
        recovery = Recovery(detected, time.time() - detected, None, steps_s=steps, kind=kind, restored=[])
        self.failover.recoveries.append(recovery)
        return recovery, died

    def _dropped(self, name: str) -> None:
        """The launcher's books without the dead replica ``name`` (replaced whole, as below)."""
        run = self.launcher
        keep = [i for i, n in enumerate(run.names) if n != name]
        node_of = dict(run.node_of)
        node_of.pop(name, None)
        run.node_of, run.handles, run.names = node_of, [run.handles[i] for i in keep], [run.names[i] for i in keep]

    def _promoted(self, victim: tuple, new: Replica) -> None:
        """The launcher's books: the instance's slot is the new primary's actor, its own slot goes
        (status() reads these on other threads: each replaced whole)."""
        run = self.launcher
        primary = run.plan.actor_name(victim)
        keep = [i for i, n in enumerate(run.names) if n != new.name]
        handles = [new.handle if run.names[i] == primary else run.handles[i] for i in keep]
        names = [run.names[i] for i in keep]
        actors = dict(run.actors)
        actors[victim] = new.handle
        real_names = dict(run.real_names)
        real_names[primary] = new.name
        node_of = dict(run.node_of)
        node_of[primary] = node_of.pop(new.name, None)
        addresses = dict(run.addresses)
        addresses[victim] = new.where  # where a replacement of a source instance connects to it
        run.actors, run.real_names, run.node_of, run.handles, run.names, run.addresses = actors, real_names, node_of, handles, names, addresses
        new.name = primary
