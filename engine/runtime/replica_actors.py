"""The stage and acker actors' parts under ``replicas=r`` (issue 58, design items 4 and 5),
mixed into :class:`~.actors.StageActor` and :class:`~.actors.AckerActor`: the fan-out
of batches and the acker's messages to every replica, a replica that is not the primary keeping
its sinks' bundles, and each actor's part when a replica dies
(:mod:`driftstream.engine.control.replica_failover` calls them in order); under
``verify="majority"`` (and ``"sample:N"``, without the gate) the replicas' digests, the primary's gate (:mod:`.replica_voter`) and the
acker's tally (:mod:`driftstream.ordering.epoch_votes`). What the simulator does alike is
:mod:`.replicas` and :mod:`.simulated_votes`; with ``replicas=1`` nothing here runs.

>>> sorted(m for m in vars(ReplicaStageSide) if not m.startswith("_")), sorted(m for m in vars(ReplicaAckerSide) if not m.startswith("_"))
(['promote', 'replica_failed'], ['dissent_reports', 'replica_failed', 'replica_refusal'])
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any, Optional

from driftstream.ordering.epoch_votes import EpochVotes
from driftstream.ordering.meta import TOP

from driftstream.engine.model.manifest import Instance
from driftstream.engine.runtime.operators import step_error
from driftstream.engine.runtime.protocol import Ack, EpochDigest, Expelled, GateOpen, Prepared, Push, ReplaySent, Watermark
from driftstream.engine.runtime.replica_votes import Dissent, VoteRollback
from driftstream.engine.runtime.replicas import address, fan_out_copies, for_replica, promote

log = logging.getLogger(__name__)

#: A replica's exit status once a majority of its instance's replicas outvoted it (verify="majority")
EXPELLED_EXIT = 71


class ReplicaStageSide:
    """A :class:`~.actors.StageActor`'s replica methods (its ``replica_sets``, ``kept``, ``send``,
    ``host``, ``endpoint`` and ``lost`` are the actor's)."""

    async def replica_failed(self, victim: tuple, old: Any, new: Any, cut: Optional[tuple], name: str) -> dict:
        """Replica ``old`` of instance ``victim`` (actor ``name``) died. ``new`` None: it was not the
        primary, it leaves the fan-out and nothing else. Else it was, and replica ``new`` is the
        primary from the cut on: this instance's part (:meth:`InstanceHost.peer_failed` with
        nothing re-sent; its batches to ``victim`` go to ``new`` from now on). Returns the items
        cancelled."""
        victim = Instance(*victim)
        live = None if self.replica_sets is None else self.replica_sets.get(victim)
        if live is not None and old in live:
            live.remove(old)  # before the flush below: what it holds for the dead one goes to the others too
        self._forget(name)
        part = self.host.recovery
        if new is not None and self.host.draws is not None and victim == self.key:
            self.host.draws.hand_over(address(new))  # the draws it took from the dead primary, for the new one
        if new is None or part is None:
            return {"cancelled": 0}
        cancelled = part.cancelled
        self.drain.drop_from(victim)
        sends = live is not None and address(new) in self.endpoint.writers
        self.host.peer_failed(victim, new, cut, self.batch_size, reconnect=lambda: sends and self.endpoint.adopt(victim, address(new)),
                              replay=False)
        return {"cancelled": part.cancelled - cancelled}

    async def promote(self, old: Any, cut: tuple, name: str) -> dict:
        """This replica becomes its instance's primary at watermark ``cut`` (the dead primary,
        incarnation ``old``, actor ``name``): what it kept that the sinks lack is written, what it produced at or
        above the cut is sent again (the receivers cancelled the dead primary's), then its
        ReplaySent. Returns the items re-sent."""
        host = self.host
        rests = promote(host, self.kept.bundles)
        if self.voter is None or self.voter.sample is not None:
            for sink, bundle in rests:  # before anything it releases from now on
                sink.write(bundle)
            if self.voter is not None:  # sample:N: no gate, its sinks write at once from now on
                self.voter.promoted([])
        else:  # verify="majority": through its gate, before anything it releases from now on
            sid_of = {id(sink): sid for sid, (_, sink) in host.rt.sinks.barriers.items()}
            self.voter.promoted([(sid_of[id(sink)], sink, bundle) for sink, bundle in rests])
        self.kept = None
        self._forget(name)
        part = host.recovery
        part.incarnations[self.key] = part.own
        self.replica_sets[self.key].remove(old)
        if host.draws is not None:  # steps declared deterministic=False: the others' draws first, then it draws what waits
            await self._draws_handed_over(old)
            host.draws.promote(host, list(host.draws.handed.values()))
        replayed = part.replayed
        for to in list(part.log.items):
            for _, batch in part.replay(host.rt, to, part.incarnations[to], self.batch_size, since=cut):
                self.send(to, Push(batch))
        host.flush()
        self.send("acker", ReplaySent(part.own, self.key))
        return {"replayed": part.replayed - replayed}

    async def _connect_replicas(self, replicas: dict, downstream: set) -> None:
        """``replicas``: incarnation -> ``(instance, address)`` of each replica that is not the
        primary; those of ``downstream`` stages are connected."""
        for inc, (key, where) in replicas.items():
            if key[0] in downstream or self.host.draws is not None and tuple(key) == tuple(self.key) and inc != self.host.recovery.own:
                await self.endpoint.connect(address(inc), where)  # (its own instance's: the draws, see replica_draws.py)

    async def _draws_handed_over(self, old: Any, patience: float = 5.0) -> None:
        """Wait until every other live replica of its instance handed over its draws (a
        :class:`~.protocol.DrawsHeld` on the data plane, sent in its part before this promotion;
        one that died meanwhile sends none: given up after ``patience`` seconds)."""
        own, draws = self.host.recovery.own, self.host.draws
        others = [inc for inc in self.replica_sets[self.key] if inc not in (own, old)]
        deadline = time.time() + patience
        while any(inc not in draws.handed for inc in others) and time.time() < deadline:
            await asyncio.sleep(0.002)

    def _draw_followers(self) -> list:
        """The addresses of its instance's other live replicas (those it is connected to): where
        the primary's draws go (replica_draws.py)."""
        own, writers = self.host.recovery.own, self.endpoint.writers
        return [address(inc) for inc in self.replica_sets.get(self.key, ()) if inc != own and address(inc) in writers]

    def _forget(self, name: str) -> None:
        """The death of peer ``name`` is answered: its connection's end, seen late, is not a new one."""
        self.lost = type(self.lost)(self.lost.ignore | {name})
        self.endpoint.on_lost = self.lost.add

    def _send_to_replicas(self, to: Any, message: Any) -> None:
        """replicas > 1: :meth:`_send`, a batch for a replicated instance to each live replica
        (runtime/replicas.py), a replica's ReplaySent named by its incarnation."""
        kind = type(message)
        if kind is Push:
            live = self.replica_sets.get(to)
            if live is not None:
                for inc, copy in fan_out_copies(message.batch, live, self.rt.acks):
                    self._send(address(inc), Push(copy))
        elif kind is ReplaySent and self.key in self.replica_sets:
            message = ReplaySent(message.receiver, address(self.host.recovery.own))
        self._send(to, message)

    def _keep_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        """A replica that is not the primary keeps what its sinks release (taken as written)."""
        if self.kept is None:  # promoted since
            return self._write_bundle(sid, sink, bundle)
        self.kept.keep(sink, bundle)
        asyncio.get_running_loop().call_soon(self._bundle_written, self.host, sid, bundle, None)

    # -- verify="majority" (runtime/replica_voter.py) -------------------------------------------

    def _on_voted_message(self, message: Any) -> None:
        """A replica's data-plane message under ``verify="majority"``: a marker ends an epoch
        (a secondary's host takes it as a watermark), the acker opens the gate or expels it."""
        kind = type(message)
        if kind is Push:
            self.drain.push(message.batch)
        elif kind is Watermark:
            voter = self.voter
            marker = message.snapshot_id is not None
            if marker:  # before the host takes it: its part, if prepared at once, must wait at the gate
                voter.marks[message.snapshot_id] = message.t
            self.host.on_message(message if voter.primary or not marker else Watermark(message.t))
            if marker or message.t == TOP:  # the last watermark comes to the others on the data plane
                voter.marker(message.snapshot_id, message.t)
        elif kind is GateOpen:
            self.voter.open(message.t)
        elif kind is Expelled:
            print(f"driftstream {self.endpoint.me}: {message.why}", file=sys.stderr, flush=True)
            os._exit(EXPELLED_EXIT)  # the supervisor answers its death as a lost replica's
        else:
            self.host.on_message(message)

    def _send_voted(self, to: Any, message: Any) -> None:
        """:meth:`_send_to_replicas`, the primary's snapshot parts held by its gate."""
        if type(message) is Prepared:
            self.voter.part(message)
            return
        self._send_to_replicas(to, message)

    def _voted_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        """A replica's sink released ``bundle``: digested, then the primary's gated, another's
        kept; taken as written (the gate holds it, not the sink's one bundle in flight)."""
        self.voter.released(sid, bundle)
        if self.voter.primary:
            self.voter.hold(sid, sink, bundle)
        else:
            self.kept.keep(sink, bundle)
        asyncio.get_running_loop().call_soon(self._voted_written, self.host, sid, bundle)

    def _voted_written(self, host: Any, sid: int, bundle: Any) -> None:
        if host is self.host and host.bundle_written(sid, bundle, None):
            self.voter.report()  # an epoch's digest waits for its releases

    def _sampled_bundle(self, sid: int, sink: Any, bundle: Any) -> None:
        """``verify="sample:N"``: a replica's sink released ``bundle``: digested, then the
        primary's written at once (no gate), another's kept, as under ``"first"``."""
        self.voter.released(sid, bundle)
        host = self.host
        if self.voter.primary:
            self.writers.write(sid, sink, bundle, lambda error: self._sampled_written(host, sid, bundle, error))
        else:
            self.kept.keep(sink, bundle)
            asyncio.get_running_loop().call_soon(self._sampled_written, host, sid, bundle, None)

    def _sampled_written(self, host: Any, sid: int, bundle: Any, error: Optional[BaseException]) -> None:
        self._bundle_written(host, sid, bundle, error)
        if host is self.host and not host.failed:
            self.voter.report()  # a sampled epoch's digest waits for its sinks

    def _gate_write(self, sid: int, sink: Any, bundle: Any) -> None:
        """The gate let ``bundle`` through: to sink step ``sid``'s writer thread."""
        host = self.host
        self.writers.write(sid, sink, bundle, lambda error: self._gate_written(host, sid, bundle, error))

    def _gate_written(self, host: Any, sid: int, bundle: Any, error: Optional[BaseException]) -> None:
        if host is not self.host:
            return  # written for an incarnation that was reset since
        if error is not None:
            host.fail(step_error(self.plan.steps[sid].name, bundle.t_last, bundle.payloads(), error))
            return
        self.voter.written(bundle)
        if self.first_release_at is None:
            self.first_release_at = time.time()
            self.released.set()
        if not self.voter.writing:
            self.writers.idle.set()

    async def _voted_end(self, w: tuple) -> None:
        """The primary took the last watermark ``w``: its last epoch's digest goes, and it waits
        until the votes passed it and the gate's writes are acknowledged."""
        voter, host = self.voter, self.host
        voter.marker(None, w)
        while not voter.drained() and not host.failed and host is self.host:  # (a rollback's reset ends this incarnation)
            await asyncio.sleep(0.005)


class ReplicaAckerSide:
    """An :class:`~.actors.AckerActor`'s replica methods: ``replica_sets`` (replicated instance ->
    its live replicas' incarnations, the primary first) and what a replica's death does."""

    async def _connect_replicas(self, replicas: dict) -> None:
        """``replicas``: replicated instance -> ``[(incarnation, address)]``, the primary (a
        subscriber, connected already) first."""
        for key, listed in replicas.items():
            self.replica_sets[Instance(*key)] = [inc for inc, _ in listed]
            for inc, where in listed[1:]:
                await self.endpoint.connect(address(inc), where)
        if self.voting:
            self.votes = EpochVotes(self.replica_sets, every=self.sample or 1)

    def _tell_replicas(self, to: Any, message: Any) -> None:
        """What the primary of ``to`` was told, to its other replicas (a marker as a watermark)."""
        replicas = self.replica_sets.get(to)
        if replicas is not None:
            told = message if self.voting else for_replica(message, False)  # a marker ends an epoch for every replica
            for inc in replicas[1:]:
                self.endpoint.send(address(inc), told)

    async def replica_failed(self, victim: tuple, old: Any, name: str, tokens: Optional[list], handle: Any = None) -> Optional[tuple]:
        """Replica ``old`` of instance ``victim`` (actor ``name``) died; its tables go (and its ReplaySent's holds).
        ``tokens`` None: it was not the primary, nothing else. Else the next replica (``handle``)
        is the primary from the cut, the watermark now, which is returned: the snapshot being
        collected is given up (the dead primary's part may be lost), and each of ``tokens`` (every
        live instance's and replica's ReplaySent, the new primary's too) holds the cut until it
        comes."""
        victim = Instance(*victim)
        table, replicas = self.host.table, self.replica_sets[victim]
        primary = replicas[0] == old
        replicas.remove(old)
        cut = None
        # The supervisor's watch starts a new schedule after any recovery: this one must end (its
        # ids would run on beside the new one's, and "the newest committed" be a stale snapshot)
        self._end_schedule()
        if primary:
            if self.collecting is not None:
                self.collecting.set()
            cut = table.watermark
            new = replicas[0]
            for token in tokens:
                table.hold((new, token), cut)
            self.endpoint.adopt(victim, address(new))  # its watermarks, and markers, to the new primary
            self.subscribers[victim] = handle
            self.incarnations[victim] = new
        table.discard(old)
        # Its own ReplaySent died with it. Released only now: a release recomputes the watermark,
        # which must not pass the cut before the new holds are in.
        for token in [k for k in table.holds if k[1] == address(old)]:
            table.release(token)
        self.lost = type(self.lost)(self.lost.ignore | {name})  # the dead one's connection ended: seen, answered
        self.endpoint.on_lost = self.lost.add
        self.host.receive(Ack({}, None, None))  # the watermark a released hold kept back is pushed
        if self.votes is not None:  # it votes no more: the votes that waited for it go on
            self._judge(self.votes.lost(victim, old))
        return cut

    async def replica_refusal(self, ignore: tuple = (), secondaries: bool = False) -> Optional[str]:
        """replicas > 1: why a replica's death cannot fail over now (None: it can); ``ignore``: the
        ReplaySent tokens of replicas that died meanwhile (theirs go with their own failover);
        ``secondaries``: none of the dead was a primary (their tables go, nothing else: the run
        may be ending)."""
        if any(token[1] not in ignore for token in self.host.table.holds):
            return "a failover or recovery was still under way"  # its re-sends not all in: the cut would be wrong
        if secondaries and self.host.pushed == TOP and not self.catching_up:
            return None
        return await self.local_refusal()

    # -- verify="majority" (ordering/epoch_votes.py) ----------------------------------------------

    def _on_voted_message(self, message: Any) -> None:
        """An instance's message under ``verify="majority"``: a replica's digest is tallied."""
        if type(message) is EpochDigest:
            if self.votes is not None:
                self._judge(self.votes.add(Instance(*message.instance), message.replica, message.snapshot_id, message.digest))
            return
        self._on_local_message(message)

    def _judge(self, verdicts: list) -> None:
        """Act on ``verdicts``: outvoted secondaries are expelled (each exits; its death is a lost
        replica's), a corrupt primary or no majority rolls the run back (the supervisor restores
        the newest committed snapshot: each was certified); then the gate opens as far as it can."""
        sample = self.sample is not None
        for v in verdicts:
            action = "taken out of service (its death: a lost replica)"
            if v.rolls_back:
                action = ("the run rolls back to the newest committed snapshot" if not sample else
                          "the run rolls back to the newest snapshot a vote certified; what the primary released in t "
                          f"{v.t_range} (and after, before the rollback) stays in the sinks, not corrected")
            dissent = Dissent(v.instance, v.dissenters, v.epoch, v.t_range, v.digests, v.kind, action=action, released=sample)
            self.dissents.append(dissent.report())
            log.warning("driftstream: the replicas of %s disagree on t %s (%s): %s; %s", v.instance.label, v.t_range, v.kind,
                        v.digests, action)
            if v.rolls_back:
                self.error = self.error or VoteRollback(list(self.dissents))
                self.done.set()
            else:
                for inc in v.dissenters:
                    self.endpoint.send(address(inc), Expelled(f"outvoted on t {v.t_range} ({v.kind}: {v.digests})"))
        through = self.votes.released_through()
        if through > self.gate_told:
            self.gate_told = through
            for key, incs in self.replica_sets.items():
                self.endpoint.send(key, GateOpen(through))  # the primary, by its instance (adopted by a promoted one)
                for inc in incs[1:]:
                    self.endpoint.send(address(inc), GateOpen(through))

    def _last_epoch(self, w: tuple) -> None:
        """The last watermark went to the primaries (by Ray call): it ends the last epoch; the
        other replicas get it on the data plane."""
        verdicts = self.votes.ended(None, w)
        for key in self.replica_sets:
            self._tell_replicas(key, Watermark(w))
        self._judge(verdicts)

    async def dissent_reports(self) -> list:
        """verify="majority": every dissent of this acker's incarnation (:meth:`Dissent.report`)."""
        return list(self.dissents)
