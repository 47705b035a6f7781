"""One incarnation of a simulated run (:mod:`.simulator`): its acker, what is in flight, and
the moves the seeded scheduler may make within it.

A :class:`~.simulator.Simulation` starts an incarnation at the beginning, after each crash
and after each rescale; everything in flight belongs to one and is lost with it. In flight:
data batches (delivered in any order, across and within channels), control messages (FIFO
per sender and receiver, as on the data plane's connections) and sink bundles waiting to be
written. The moves: deliver a batch or a control message, flush an acker shard, read a
source chunk of random size, release held batches, write a sink bundle, persist a snapshot
write. Each draws on the run's generator, in the same order whatever runs it, so a seed
names one schedule.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Optional

from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.instance_host import ACKER
from driftstream.engine.runtime.protocol import Push, Watermark
from driftstream.engine.runtime.local_recovery import LocalRecovery
from driftstream.engine.runtime.simulated_acker import SimulatedAcker
from driftstream.engine.runtime.simulated_instances import SimulatedInstances
from driftstream.engine.runtime.replicas import REPLICA

#: Chance of a crash at a critical point (a marker: shared by every instance's), while
#: crashes remain; low enough that most crashes strike after a commit.
CRASH_AT_POINT = 0.15


class SimulatedIncarnation:
    """The acker (``ackers``, its root ``acker``) and what is in flight (``data``: (stage,
    instance, batch); ``control``: (sender, receiver) -> FIFO queue; ``writes``: (instance,
    sink step, sink partition, bundle)) of one incarnation of ``plan``, and the scheduler's
    moves within it (:meth:`deliveries`, :meth:`completions`).

    ``send_control(sender, receiver, message)``: where control messages go (the run's, so
    that what replaces it, a test's recorder, sees them all); ``maybe_crash(point, chance)``:
    the run's seeded crash, tried when an instance has taken a snapshot marker. ``replicas``:
    the run's :class:`~.simulated_replicas.SimulatedReplicas` (``replicas`` > 1; None by default).
    """

    def __init__(self, plan: Plan, live: SimulatedInstances, rng: random.Random, batch_size: int, aligned: Optional[list],
                 shards: int, send_control: Callable[[Any, Any, Any], None], maybe_crash: Callable[[str, float], bool],
                 local: Optional[LocalRecovery] = None, replicas: Any = None) -> None:
        self.live, self.rng, self.batch_size, self.maybe_crash = live, rng, batch_size, maybe_crash
        self.instance_count = len(plan.instances)
        #: whether a step is declared deterministic=False (else no instance has output logs to write)
        self.logged = bool(plan.logged_steps)
        self.send_control = send_control
        #: recovery="local": the run's side of it (logs, inputs taken, cuts), None by default
        self.local = local
        self.ackers = SimulatedAcker(len(plan.source_instances), send_control, plan.instances, aligned, shards, local)
        self.acker = self.ackers.root
        self.data: list = []
        self.control: dict = {}
        self.writes: list = []
        #: replicas > 1: batches and the acker's messages to a replicated instance go to each replica
        self.replicas = replicas
        if replicas is not None:
            replicas.incarnation = self

    # -- what the instances send ----------------------------------------------------------

    def enqueue(self, sender: Any, receiver: Any, message: Any) -> None:
        """``message`` joins the FIFO queue from ``sender`` to ``receiver`` (to each of its replicas'
        with replicas)."""
        if self.replicas is None:
            self.control.setdefault((sender, receiver), deque()).append(message)
            return
        for to in self.replicas.addresses(receiver):
            self.control.setdefault((sender, to), deque()).append(message)

    def sender(self, instance: Instance) -> Callable:
        """The transport of ``instance``'s host: a batch joins the data in flight (delivered in
        any order), any other message its FIFO control queue."""
        def send(to, message) -> None:
            if type(message) is Push:
                if self.replicas is None:
                    self.data.append((*to, message.batch))
                else:
                    self.replicas.fan_out(to, message.batch, self.live.hosts[instance].rt.acks)
            else:
                self.send_control(instance, to, message)
        return send

    def bundle_writer(self, instance: Instance) -> Callable:
        """Where ``instance``'s sink bundles wait until the scheduler writes them."""
        return lambda sid, sink, bundle: self.writes.append((instance, sid, sink, bundle))

    def lose(self, instance: Instance) -> None:
        """``instance`` failed alone (recovery="local"): every batch and control message to or
        from it is lost, and its sink writes (the process died before they landed)."""
        self.data = [d for d in self.data if (d[0], d[1]) != instance and d[2].sender != instance]
        for pair in [p for p in self.control if instance in p]:
            del self.control[pair]
        self.writes = [w for w in self.writes if w[0] != instance]

    def lose_replica(self, incarnation: Any, address: Any, primary_of: Optional[Instance]) -> None:
        """Replica ``incarnation`` (control address ``address``; the primary of ``primary_of``,
        else None) died: every batch on its channels and every control message to or from it is
        lost, and the primary's sink writes."""
        self.data = [d for d in self.data if incarnation not in d[2].channel]
        for pair in [p for p in self.control if address in p]:
            del self.control[pair]
        if primary_of is not None:
            self.writes = [w for w in self.writes if w[0] != primary_of]

    def land_writes(self, hosts: dict) -> int:
        """A reset in place, as StageActor.reset: the sink writes in progress of ``hosts``
        finish (SinkWriters.close waits for them) before the next incarnation reads its
        sinks, and their callbacks find the old ``hosts`` closed. Returns how many landed."""
        landing = [w for w in self.writes if w[0] in hosts]
        for instance, sid, sink, bundle in landing:
            sink.write(bundle)
            hosts[instance].bundle_written(sid, bundle)
        return len(landing)

    def flush(self, instance: Instance) -> int:
        """Send what ``instance`` has to send (see :meth:`InstanceHost.flush`); returns the elements sent."""
        return self.live.hosts[instance].flush()

    # -- the scheduler's moves --------------------------------------------------------------

    def deliveries(self, reading: bool) -> list:
        """The moves that bring an instance or the acker something new: a data batch, a
        control message, an acker shard's batch, and (``reading``) a source's chunk."""
        moves: list = []
        if self.data:
            moves.append(self.deliver_data)
        if any(self.control.values()):
            moves.append(self.deliver_control)
        if self.ackers.pending:
            moves.append(self.flush_acker_shard)
        if reading and any(self.live.source_ready(k) for k in self.live.readers):
            moves.append(self.read_source)
        return moves

    def completions(self) -> list:
        """The moves that finish what instances have taken: held batches released, a sink
        bundle written, a snapshot write persisted, an output log's segments written."""
        moves: list = []
        if any(rt.holding for rt in self.live.stages.values()):
            moves.append(self.release_held)
        if self.replicas is not None and any(h.rt.holding for h in self.replicas.secondaries()):
            moves.append(self.release_held_replica)
        if self.writes:
            moves.append(self.write_bundle)
        if any(s.pending_writes() for s in self.live.snapshots.values()):
            moves.append(self.persist)
        if self.logs_due():
            moves.append(self.write_output_log)
        return moves

    def logs_due(self) -> bool:
        """Whether an instance's output logs (steps declared deterministic=False) have entries to write."""
        return self.logged and any(h.output_logs is not None and h.output_logs.due for h in self.live.hosts.values())

    def deliver_data(self) -> None:
        i = self.rng.randrange(len(self.data))
        self.data[i], self.data[-1] = self.data[-1], self.data[i]
        stage, index, batch = self.data.pop()
        if self.replicas is None:
            self.live.hosts[(stage, index)].receive([batch])
            return
        host = self.replicas.receiver((stage, index), batch)
        if host is not None:  # else: for a replica that died
            host.receive([batch])

    def deliver_control(self) -> None:
        sender, receiver = self.rng.choice([k for k, q in self.control.items() if q])
        message = self.control[(sender, receiver)].popleft()
        if receiver == ACKER:
            self.ackers.receive(sender, message)
        elif self.ackers.relays(receiver):  # the acker's watermark, for a shard to pass on
            self.ackers.relay(receiver, message)
        elif self.replicas is not None and receiver[0] == REPLICA:
            self.replicas.deliver(receiver, message).flush()
        else:
            self.live.hosts[receiver].on_message(message)
            if type(message) is Watermark and message.snapshot_id is not None:
                self.maybe_crash("after a marker", CRASH_AT_POINT / self.instance_count)
            if receiver in self.live.stages:  # else: a crash at the marker
                self.flush(receiver)

    def flush_acker_shard(self) -> None:
        self.ackers.flush_one(self.rng)

    def read_source(self) -> None:
        readers = self.live.readers
        instance = self.rng.choice([k for k in readers if self.live.source_ready(k)])
        budget = self.rng.randint(1, self.batch_size)
        items = readers[instance].poll(budget)
        if items:
            self.live.hosts[instance].guarded(self.live.stages[instance].process_source, items)
        # Senders never say more is coming here: a sender that did would hold the others for
        # MERGE_MAX_HOLD_S of simulated time (a thousand steps), and the scheduler's random
        # "release held" steps already give the merge every interleaving.
        sent = self.flush(instance)
        if items:
            readers[instance].made(len(items), sent)

    def release_held(self) -> None:
        instance = self.rng.choice([k for k, rt in self.live.stages.items() if rt.holding])
        host = self.live.hosts[instance]
        host.guarded(host.rt.release_held, self.rng.random() < 0.5)
        self.flush(instance)

    def release_held_replica(self) -> None:
        """As :meth:`release_held`, for a replica that is not the primary."""
        host = self.rng.choice([h for h in self.replicas.secondaries() if h.rt.holding])
        host.guarded(host.rt.release_held, self.rng.random() < 0.5)
        host.flush()

    def write_bundle(self) -> None:
        instance, sid, sink, bundle = self.writes.pop(self.rng.randrange(len(self.writes)))
        sink.write(bundle)
        self.live.hosts[instance].bundle_written(sid, bundle)
        self.flush(instance)

    def write_output_log(self) -> None:
        """An instance's output log segments land in the store; the acks that waited for them go."""
        instance = self.rng.choice([k for k, h in self.live.hosts.items() if h.output_logs is not None and h.output_logs.due])
        self.live.hosts[instance].write_output_logs()

    def persist(self) -> None:
        instance = self.rng.choice([k for k, s in self.live.snapshots.items() if s.pending_writes()])
        self.live.snapshots[instance].write_next()
        self.flush(instance)
