"""Replicas in the simulator (``replicas=r``, ``verify="first"``; issue 58, design item 4): every
keyed stage instance runs as ``r`` copies fed the same input in the same t order, so their
settled output is the same; the receivers take one copy's stream (the primary's) and a
replica's death costs no restore of anyone and no rollback.

- Every batch sent to a replicated instance goes to each live replica, a copy per replica on
  its own channel ``(sender incarnation, replica incarnation)``, its hold XORed into the
  sender's acks (:meth:`SimulatedReplicas.fan_out`); each replica acks its copy. The acker's
  watermarks go to every replica; snapshot markers only to the primary (one part per
  instance: a replica that is not the primary takes no snapshot).
- A replica that is not the primary sends nothing downstream: its output is dropped but
  logged (its :class:`~.instance_recovery.InstanceRecovery` has the cut ``TOP``), and what
  its sinks release is kept (trimmed at each commit) instead of written.
- A replica that is not the primary dies: its channels' tables are discarded; nothing else.
- The primary dies (:meth:`SimulatedReplicas.fail`): local recovery's item 3 with the
  replacement already at the front. ``W``, the watermark then, is the cut; every other
  instance and replica cancels what the dead primary sent it at or above ``W`` (under a hold
  at ``W`` until its :class:`~.protocol.ReplaySent`); the next replica becomes the primary,
  re-sends from its log what it produced at or above ``W`` (below ``W`` the receivers have
  the same, settled), writes what it kept that its sinks do not hold and drops what they do,
  and writes a base at its next snapshot (its chains are not the dead primary's).

A lost replica is replaced (:mod:`.replica_replacements`: restored from the newest committed
snapshot, caught up, then a replica as any other). ``crashes`` beside replicas: a crash of an
instance without replicas is a local recovery (:mod:`.local_recovery`) in which every replica
of its peers takes its part (:meth:`SimulatedReplicas.peers_of`); a crash of one with replicas,
a global rollback (:mod:`.local_refusals`). A rescale restarts every replica at the new
parallelism (:meth:`SimulatedReplicas.restart`), as a global rollback does; crashes and
rescales in one run too. Steps declared ``deterministic=False``: the primary draws, the others take its draws
(:mod:`.replica_draws`).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("replicas")
>>> f.source(MemorySource(range(6), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> config = RunConfig(seed=3, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=2)
>>> sim = Simulation(f.plan(2), config, replica_crashes=2)
>>> sorted(sim.run().output("o")), sim.replicas.failovers + len(sim.replicas.failures) > 0, sim.restores
([0, 1, 2, 4, 6, 9], True, Counter())
"""

from __future__ import annotations

import os
import random
from typing import Any, Iterator, Optional

from driftstream.ordering.meta import TOP

from driftstream.engine.model.config import InstanceConfig, RunConfig
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.instance_host import ACKER, InstanceHost
from driftstream.engine.runtime.local_recovery import LocalRecovery
from driftstream.engine.runtime.protocol import Ack, Prepared, Push, ReplaySent, Watermark
from driftstream.engine.runtime.replica_draws import InstanceDraws
from driftstream.engine.runtime.replicas import KeptBundles, address, fan_out_copies, for_replica, promote
from driftstream.engine.runtime.simulated_instances import SimulatedInstances


class SimulatedReplicas:
    """The replicas of a run's replicated instances (``replicated``: see :meth:`RunConfig.replicated`): ``sets`` (instance -> its live replicas' incarnations, the primary first) and
    ``hosts`` (incarnation -> (instance, host)). ``failovers``: primaries that died;
    ``failures``: every replica that died, ``(instance, incarnation, was the primary)``.
    ``incarnation``: the run's :class:`~.simulated_incarnation.SimulatedIncarnation`, set by
    it."""

    def __init__(self, plan: Plan, config: RunConfig, local: LocalRecovery, live: SimulatedInstances) -> None:
        self.local, self.live, self.config = local, live, config
        #: instance -> how many replicas it runs as (RunConfig.replicated; a rescale's plan's after it)
        self.replicated = config.replicated(plan)
        self.sets: dict = {}
        self.hosts: dict = {}
        #: incarnation (not the primary) -> [(sink partition, bundle)] its sinks released since the last commit
        self.kept: dict = {}
        self.failovers, self.failures = 0, []
        self.incarnation: Any = None
        #: verify="majority": the run's :class:`~.simulated_votes.SimulatedVotes` and
        #: :class:`~.replica_replacements.ReplicaReplacements` (None: verify="first")
        self.votes: Any = None
        self.replacements: Any = None

    def start(self, plan: Plan, instance: Instance, config: InstanceConfig, rng: random.Random, base_every_s: float) -> InstanceHost:
        """Start ``instance``'s replicas from ``config``; the first, the primary, is the live
        one (``live.hosts``). Returns it."""
        incs = [self.local.incarnations[instance]] + [self.local.new_incarnation() for _ in range(self.replicated[instance] - 1)]
        self.sets[instance] = incs
        for n, inc in enumerate(incs):
            scratch = os.path.join(self.live.scratch, f"replica-{inc}")  # a working directory per replica
            os.makedirs(scratch, exist_ok=True)
            host = self.live.host(plan, instance, config, rng.getrandbits(32), base_every_s, self._bundle_writer(instance, inc),
                                  self._sender(inc), scratch, incarnations=self.local.incarnations, incarnation=inc)
            self.hosts[inc] = (instance, host)
            if host.output_logs is not None:  # steps declared deterministic=False: the primary draws (replica_draws.py)
                host.draws = self.draws(instance, inc, host, n == 0)
            if self.votes is not None:
                self.votes.started(instance, inc, host)
            if n:
                host.recovery.cut = TOP  # its output dropped, but logged
                seed = host.rt.take_seed()
                if seed:
                    self.incarnation.acker.seed(host.recovery.tag(seed))
        primary = self.hosts[incs[0]][1]
        self.live.register(instance, primary)
        return primary

    def draws(self, instance: Instance, inc: Any, host: InstanceHost, primary: bool) -> InstanceDraws:
        """Replica ``inc``'s side of its stage's steps declared deterministic=False (replica_draws.py)."""
        return InstanceDraws(host.rt, primary, inc, self._sender(inc), lambda: [address(i) for i in self.sets.get(instance, ()) if i != inc],
                             lambda: self.sets[instance][0])

    def is_primary(self, incarnation: Any) -> bool:
        entry = self.hosts.get(incarnation)
        return entry is not None and self.sets[entry[0]][0] == incarnation

    # -- the transport ------------------------------------------------------------------------

    def _sender(self, inc: Any):
        """The transport of replica ``inc``: its batches fanned out, its messages to the acker
        from its address (a ReplaySent names it), its snapshot parts only while it is the primary."""
        def send(to, message) -> None:
            kind = type(message)
            if kind is Push:
                self.fan_out(to, message.batch, self.hosts[inc][1].rt.acks)
            elif kind is Prepared and not self.is_primary(inc):
                return
            else:
                if kind is ReplaySent:
                    message = ReplaySent(message.receiver, address(inc))
                self.incarnation.send_control(address(inc), to, message)
        return send

    def _bundle_writer(self, instance: Instance, inc: Any):
        """The primary's bundles wait for the scheduler to write them; another's are kept. With
        votes, the primary's wait for their epoch's vote, taken as written meanwhile: one bundle in
        flight per sink would hold its epoch's later releases, and so its digest, back."""
        def write(sid, sink, bundle) -> None:
            votes = self.votes
            if votes is not None:
                votes.released(inc, sid, bundle)
            if self.is_primary(inc) and votes is None:
                self.incarnation.writes.append((instance, sid, sink, bundle))
                return
            if self.is_primary(inc):
                votes.hold(inc, sink, bundle)
            else:
                self.kept.setdefault(inc, KeptBundles()).keep(sink, bundle)
            self.hosts[inc][1].bundle_written(sid, bundle)
        return write

    def fan_out(self, to: Instance, batch: Any, acks: Any) -> None:
        """``batch`` (a :class:`~.outbound.ChannelBatch`) joins the data in flight, and to a
        replicated ``to`` a copy for each other live replica, its hold XORed into ``acks``
        (the sender's, not yet flushed)."""
        data = self.incarnation.data
        data.append((*to, batch))
        for _, copy in fan_out_copies(batch, self.sets.get(to, ()), acks):
            data.append((*to, copy))

    def receiver(self, to: Instance, batch: Any) -> Optional[InstanceHost]:
        """The host a batch for ``to`` goes to (None: a replica that died)."""
        if to not in self.sets:
            return self.live.hosts[to]
        entry = self.hosts.get(batch.channel[1])
        return None if entry is None else entry[1]

    def addresses(self, receiver: Any) -> list:
        """Where the acker's message to ``receiver`` queues: each live replica's address."""
        incs = self.sets.get(receiver)
        if incs is None:
            return [receiver]
        if self.replacements is not None:  # a replacement catching up is told its frontier instead
            return [address(inc) for inc in incs if inc not in self.replacements.catching_up]
        return [address(inc) for inc in incs]

    def deliver(self, receiver: tuple, message: Any) -> InstanceHost:
        """The acker's ``message`` to replica address ``receiver``: a marker only to the primary."""
        instance, host = self.hosts[receiver[1]]
        message = for_replica(message, self.is_primary(receiver[1]))
        host.on_message(message)
        if self.votes is not None and type(message) is Watermark:
            self.votes.watermark(instance, receiver[1], host, message.t, message.snapshot_id is not None)
        return host

    def secondaries(self) -> Iterator[InstanceHost]:
        """The live replicas that are not the primary."""
        for incs in self.sets.values():
            for inc in incs[1:]:
                yield self.hosts[inc][1]

    # -- commits and failures -------------------------------------------------------------------

    def trim(self, t: tuple) -> None:
        """Snapshot ``t`` committed: logs keep what is at or after it; kept bundles below it are in
        the sinks (with votes: below the snapshot the votes certified, which a replacement restores)."""
        if self.votes is not None:
            t = min(t, self.votes.certified_t())
        for kept in self.kept.values():
            kept.trim(t)
        for host in self.secondaries():
            host.recovery.trim(t)

    def can_fail(self) -> bool:
        """Whether an instance has a replica to lose (two live ones)."""
        return bool(self.can_lose())

    def whole(self) -> list:
        """The live replicas of the instances that have all of theirs, none catching up (what a
        seeded flip strikes: with one voter left nothing would see it)."""
        catching = {} if self.replacements is None else self.replacements.catching_up
        return sorted(inc for key, incs in self.sets.items() if len(incs) == self.replicated[key] and not any(i in catching for i in incs) for inc in incs)

    def can_lose(self) -> list:
        """The instances with two live replicas, none catching up (it could not be promoted)."""
        catching = {} if self.replacements is None else self.replacements.catching_up
        return sorted(k for k, incs in self.sets.items() if len(incs) > 1 and not any(inc in catching for inc in incs))

    def fail_one(self, rng: random.Random, batch_size: int) -> tuple:
        """A seeded replica of an instance with two live ones dies (see the module doc); returns
        ``(instance, incarnation, was the primary)``."""
        instance = rng.choice(self.can_lose())
        return self.fail(instance, rng.choice(self.sets[instance]), batch_size)

    def fail(self, instance: Instance, inc: Any, batch_size: int) -> tuple:
        """Replica ``inc`` of ``instance`` dies, or is removed (a dissenter); as :meth:`fail_one`."""
        primary = self.sets[instance][0] == inc
        incarnation = self.incarnation
        if primary:
            for _, host, _ in self._peers(None):  # what each holds goes on the channels of now
                host.flush()
            collecting = incarnation.acker.collecting
            if collecting is not None:  # the dead primary's part may be lost: given up, as in local recovery
                incarnation.acker.end_snapshot(collecting.snapshot_id)
        _, host = self.hosts.pop(inc)
        self.sets[instance].remove(inc)
        self.kept.pop(inc, None)
        if primary:
            self.live.stop_one(instance)
        else:
            host.close(keep_sinks=True)
        incarnation.lose_replica(inc, address(inc), instance if primary else None)
        table = incarnation.acker.table
        cut = table.watermark
        table.discard(inc)
        self.failures.append((instance, inc, primary))
        if primary:
            self._promote(instance, cut, batch_size)
        # Its ReplaySent died with it (its part was in its discarded tables). Released only now: a
        # release recomputes the watermark, which must not pass the cut before the promotion holds it.
        for token in [k for k in table.holds if k[1] == address(inc)]:
            table.release(token)
        incarnation.acker.receive(Ack({}, None, None))  # the watermark a released hold kept back is pushed
        if self.replacements is not None:
            self.replacements.lost(inc)
        if self.votes is not None:
            self.votes.lost(instance, inc, primary)
        return instance, inc, primary

    def _peers(self, but: Any) -> Iterator[tuple]:
        """``(the token of its ReplaySent, host, whether its stream is taken)`` of every live host
        but replica ``but``: an instance without replicas, or a primary."""
        for key, host in self.live.hosts.items():
            if key not in self.sets:
                yield key, host, True
        for inc, (instance, host) in self.hosts.items():
            if inc != but:
                yield address(inc), host, self.sets[instance][0] == inc

    def peers_of(self, victim: Instance) -> list:
        """Who takes a part when ``victim``, an instance without replicas, fails (see
        local_recovery.py): ``(the token of its ReplaySent, host, whether it re-sends its log)``
        of every other live host. Every replica cancels what the dead one sent it; only the
        primaries re-send (the others' output is dropped: theirs would reach the replacement twice)."""
        return [peer for peer in self._peers(None) if peer[0] != victim]

    def _promote(self, instance: Instance, cut: tuple, batch_size: int) -> None:
        """The next replica of ``instance`` becomes the primary at watermark ``cut``."""
        self.failovers += 1
        new = self.sets[instance][0]
        host = self.hosts[new][1]
        self.local.incarnations[instance] = new
        self.live.register(instance, host)
        self.local.parts[instance] = host.recovery
        if host.draws is not None:  # steps declared deterministic=False: the others' draws first, then it draws what waits
            host.draws.promote(host, [self.hosts[i][1].draws.held() for i in self.sets[instance] if i != new])
        kept = self.kept.pop(new, None)
        for sink, bundle in promote(host, [] if kept is None else kept.bundles):  # the dead primary's writes in flight were lost
            if self.votes is not None:
                self.votes.hold(new, sink, bundle)
            else:
                sink.write(bundle)
        table = self.incarnation.acker.table
        for token, peer, _ in self._peers(new):
            table.hold((new, token), cut)
            peer.peer_failed(instance, new, cut, batch_size, replay=False)
        table.hold((new, address(new)), cut)
        part = host.recovery
        for to in list(part.log.items):
            for _, batch in part.replay(host.rt, to, self.local.incarnations[to], batch_size, since=cut):
                self.fan_out(to, batch, host.rt.acks)
        host.flush()
        self.incarnation.send_control(address(new), ACKER, ReplaySent(new, address(new)))

    def close(self) -> None:
        """Close the replicas that are not the primary (the run closes the primaries)."""
        for host in self.secondaries():
            host.close(keep_sinks=True)

    def restart(self, plan: Optional[Plan] = None) -> None:
        """A global rollback, or a rescale to ``plan``: every replica goes (the run stops the
        primaries); the next incarnation starts them anew from the snapshot it restores, each
        replica of an instance from the instance's part (at ``plan``'s parallelism)."""
        self.close()
        if plan is not None:
            self.replicated = self.config.replicated(plan)
        self.sets, self.hosts, self.kept = {}, {}, {}
        if self.replacements is not None:
            self.replacements.catching_up.clear()
