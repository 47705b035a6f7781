"""Steps declared ``deterministic=False`` in a replicated instance (``replicas`` > 1; issue 58,
design item 6): the primary draws, the other replicas take its draws.

Each replica runs the step behind its output log (:class:`~.logged_step.LoggedStep`); with
replicas the log's operator gets a :class:`ReplicaDraws`:

- *The primary* computes an input's outputs (one draw per input version: an input, by its Meta
  and its payload's ``repr``, drawn once stays drawn until the watermark passes it, so a
  speculative re-run upstream does not draw again), records them in its log (written before its
  acks, as without replicas) and sends them to the other replicas, :class:`~.protocol.Drawn`, one
  message per batch it ran.
- *Another replica* never calls the function: an input whose draw it has takes it; one whose draw
  has not come yet waits, under a hold in its acks at the input's time (so the watermark cannot
  pass the input, and nothing downstream of it settles, before the draw came); the draw, when it
  comes, runs on through the rest of the stage (:meth:`StageRuntime.process_outputs`) and the
  hold goes. A tombstone of an input still waiting takes it and its hold back. It writes no log
  (the primary's is the instance's).
- *Another replica* takes nothing of its own log (the primary sends every output it gives, a
  replayed one too) until the primary sends every draw it holds (:meth:`InstanceDraws.sync`: after
  a promotion, and to a replacement of a dead or outvoted replica): then it reloads its log and
  takes from it what is below the primary's watermark then (durable, and the latest entry; above
  it the log may hold a dead primary's entry for an input its successor drew again, not durable yet).
- *Promoted* (the primary died): the other replicas hand it the draws they hold
  (:class:`~.protocol.DrawsHeld`: one may have taken a draw of the dead primary that never reached
  it), it takes them, takes its log's entry for what still waits or else draws it, sends the
  others every draw it holds, and writes every entry it holds before its
  :class:`~.protocol.ReplaySent` (what the dead primary drew but had not made durable was not
  released: its acks waited for the write; the promoted one's did not, so they are written
  first); from then on it is the primary, taking its whole log as an original primary does: an
  entry its restore loaded (a global rollback's) may have been released before the rollback, and
  a new draw would contradict it. What it takes from its log it writes again: a dead primary's
  entry there may have been replaced in the store by a successor's draw since it loaded it, and a
  later restore must find what it used.

So the replicas' downstream state agrees and their votes too; a failover draws nothing already
drawn and released; a restore replays the primary's log on every replica alike.

>>> import random
>>> from driftstream.engine.runtime.operators import Map
>>> from driftstream.snapshots.output_log import OutputLog
>>> draws = iter([0.25, 0.5])
>>> primary = LoggedStep(Map("noisy", lambda x: x + next(draws)), OutputLog(), flat=False)
>>> sent, acks = [], {}
>>> primary.replica = ReplicaDraws(True, _Acks(acks), random.Random(1), sent.append)
>>> other = LoggedStep(Map("noisy", lambda x: 1 / 0), OutputLog(), flat=False)
>>> other.replica = ReplicaDraws(False, _Acks(acks), random.Random(2), None)
>>> m = (1, 0, 0, 1, (), False)
>>> other.run([(m, 1, None)]), len(acks)            # no draw yet: it waits, held at t
([], 1)
>>> primary.run([(m, 1, None)]), primary.run([(m, 1, None)])   # drawn once
([((1, 0, 0, 1, (), False), 1.25, None)], [((1, 0, 0, 1, (), False), 1.25, None)])
>>> other.replica.given(other, sent[0]), acks      # the draw comes: on through the stage, the hold gone
([((1, 0, 0, 1, (), False), 1.25, None)], {(1, 0, 0, 1): 0})
"""

from __future__ import annotations

import random
from typing import Any, Callable, Optional

from driftstream.ordering.meta import BOTTOM, TOP, tombstone_of

from driftstream.engine.runtime.logged_step import LoggedStep
from driftstream.engine.runtime.protocol import Drawn, DrawsHeld


class _Acks:
    """A dict as an acks table (the doctest's)."""

    def __init__(self, table: dict) -> None:
        self.table = table

    def xor(self, t: tuple, x: int) -> None:
        self.table[t] = self.table.get(t, 0) ^ x


def _key(meta: tuple, payload: Any) -> tuple:
    """An input version's key: its Meta (as an element) and its payload's ``repr``."""
    return (meta[:5] + (False,), repr(payload))


class ReplicaDraws:
    """One replica's side of one declared step: ``primary`` or not; ``acks`` (its runtime's
    table, where a waiting input's hold goes), ``rng`` (hold ids), ``publish(entries)`` (the
    primary's: sends its draws to the other replicas)."""

    __slots__ = ("primary", "acks", "rng", "publish", "drawn", "waiting", "drawn_count", "taken", "replay_below", "promoted")

    def __init__(self, primary: bool, acks: Any, rng: random.Random, publish: Optional[Callable[[list], None]]) -> None:
        self.primary, self.acks, self.rng, self.publish = primary, acks, rng, publish
        #: the time below which its log's entries are taken: the primary's, all; another's, none
        #: (the primary sends every output it gives, replayed too) but, once the primary's draws
        #: came whole, below its watermark then: above it the log may hold a dead primary's entry
        #: for an input its successor drew again, not durable yet
        self.replay_below = TOP if primary else BOTTOM
        #: promoted from another replica: what it takes from its log it writes again (the store may
        #: have replaced that entry since it loaded it: a successor's draw for a dead primary's input)
        self.promoted = False
        self.drawn: dict = {}  # key -> outputs: the primary's draws (its own, or given), until the watermark passes
        self.waiting: dict = {}  # key -> (item, hold id): another replica's inputs whose draw has not come
        self.drawn_count = self.taken = 0  # inputs drawn here, inputs that took a draw given

    def run(self, step: LoggedStep, items: list) -> list:
        """:meth:`LoggedStep.run` of a replica."""
        log, drawn, primary = step.log, self.drawn, self.primary
        replay = log.replay
        fresh = []
        if primary:
            fresh = [item for item in items if not item[0][5] and _key(item[0], item[1]) not in drawn and item[0] not in replay]
        computed = step._by_parent(fresh) if fresh else {}
        out: list = []
        new: list = []
        for item in items:
            meta = item[0]
            key = _key(meta, item[1])
            if meta[5]:
                waited = self.waiting.pop(key, None)
                if waited is not None:  # its element never went on: nothing to take back
                    self.acks.xor(meta[:4], waited[1])
                    continue
                given = log.retract(key[0])
                if given is None:
                    given = drawn.get(key)
                if given is None:
                    given = replay.get(key[0])
                if given is None:  # its element went through before this incarnation's log: compute
                    out.extend(step.inner.run([item]))
                else:
                    out.extend((tombstone_of(m), p, k) for m, p, k in given)
                continue
            outputs = drawn.get(key)  # this version's draw first: a replayed entry may be another version's
            replayed = False
            if outputs is None and meta[:4] < self.replay_below:
                outputs = replay.get(meta)
                replayed = outputs is not None
            if outputs is None:
                if not primary:
                    hold = self.rng.getrandbits(64) or 1
                    self.waiting[key] = (item, hold)
                    self.acks.xor(meta[:4], hold)
                    continue
                outputs = drawn[key] = computed[meta].pop(0)
                new.append((key, outputs))
                self.drawn_count += 1
            elif primary and replayed:  # the others may not have it (a replacement takes little of its log)
                drawn[key] = outputs
                new.append((key, outputs))
            log.record(meta, outputs, fresh=primary and (self.promoted or not replayed))
            out.extend(outputs)
        if new and self.publish is not None:
            self.publish(new)
        return out

    def given(self, step: LoggedStep, entries: list, whole: Optional[tuple] = None) -> list:
        """The primary's draws ``entries`` came (``whole``: every draw it holds, and its watermark
        then): the outputs of the inputs that waited for them (to run on through the stage), their
        holds released."""
        out: list = []
        drawn, waiting = self.drawn, self.waiting
        for key, outputs in entries:
            drawn[key] = outputs
            if key in waiting:
                out.extend(self._take(step, key, outputs))
        if whole is not None and whole > self.replay_below:  # what waited below it may take its log's now
            self.replay_below = whole
            replay = step.log.replay
            for key in [key for key in waiting if key[0][:4] < whole and key[0] in replay]:
                out.extend(self._take(step, key, replay[key[0]]))
        return out

    def _take(self, step: LoggedStep, key: tuple, outputs: list) -> list:
        """Waiting input ``key`` gets ``outputs``: recorded, its hold released; they are returned."""
        item, hold = self.waiting.pop(key)
        meta = item[0]
        step.log.record(meta, outputs, fresh=False)
        self.acks.xor(meta[:4], hold)
        self.taken += 1
        return outputs

    def promote(self, step: LoggedStep, publish: Optional[Callable[[list], None]]) -> list:
        """This replica is the primary now: what waited takes its log's entry, else is drawn (their
        outputs returned, to run on through the stage; their holds released), and it publishes
        from now on (what it took here goes with the rest of its draws: :meth:`InstanceDraws.promote`).
        From now on it takes its whole log, as an original primary does (see the module doc)."""
        self.primary, self.publish, self.replay_below, self.promoted = True, publish, TOP, True
        waiting, self.waiting = self.waiting, {}
        if not waiting:
            return []
        replay = step.log.replay
        fresh = [item for item, _ in waiting.values() if item[0] not in replay]
        computed = step._by_parent(fresh) if fresh else {}
        out = []
        for key, (item, hold) in waiting.items():
            meta = item[0]
            logged = replay.get(meta)
            outputs = self.drawn[key] = computed[meta].pop(0) if logged is None else logged
            step.log.record(meta, outputs, fresh=True)
            out.extend(outputs)
            self.acks.xor(meta[:4], hold)
        self.drawn_count += len(fresh)
        return out

    def settle(self, watermark: tuple) -> None:
        """Forget the draws below ``watermark`` (no input version below it comes again)."""
        if len(self.drawn) > 64:
            self.drawn = {k: o for k, o in self.drawn.items() if not k[0] < watermark}


class InstanceDraws:
    """A replica's :class:`ReplicaDraws`, one per declared step of its stage (``steps``: step id
    -> its :class:`LoggedStep`), and its messages: it is incarnation ``own``; ``send(to,
    message)`` (its transport), ``followers()`` (the addresses of the other live replicas, where
    the primary's draws go), ``primary()`` (the incarnation of its instance's primary now: a
    dead one's draws, come late, are not taken)."""

    def __init__(self, rt: Any, primary: bool, own: Any, send: Callable[[Any, Any], None], followers: Callable[[], list],
                 primary_now: Callable[[], Any]) -> None:
        self.rt, self.own, self.send, self.followers, self.primary_now = rt, own, send, followers, primary_now
        self.steps = {sid: op for sid, op in rt.operators.items() if type(op) is LoggedStep}
        #: the new primary's: replica -> the draws it handed over (:class:`~.protocol.DrawsHeld`)
        self.handed: dict = {}
        for sid, op in self.steps.items():
            op.replica = ReplicaDraws(primary, rt.acks, rt.rng, self._publisher(sid) if primary else None)
            if not primary:
                op.log.pending = None  # the primary's log is the instance's: this one writes nothing

    def _publisher(self, sid: int) -> Callable[[list], None]:
        def publish(entries: list) -> None:
            message = Drawn(sid, entries, self.own)
            for to in self.followers():
                self.send(to, message)
        return publish

    def take(self, host: Any, message: Any) -> None:
        """The primary's :class:`~.protocol.Drawn` came: what waited for it runs on; the acks go.
        A dead primary's, come late, is not taken (nor any once this one is the primary: it
        draws itself). A :class:`~.protocol.DrawsHeld` is kept for the promotion."""
        if type(message) is DrawsHeld:
            self.handed[message.sender] = message.steps
            return
        step = self.steps[message.step]
        if step.replica.primary or message.sender != self.primary_now():
            return
        if message.whole is not None and host.output_logs is not None:  # its log as the store holds it now (below whole: durable)
            host.output_logs.reload()
        out = step.replica.given(step, message.entries, message.whole)
        if out:
            host.guarded(self.rt.process_outputs, message.step, out)
        host.flush()

    def held(self) -> dict:
        """Step id -> every draw this replica holds (what it hands the new primary)."""
        return {sid: list(step.replica.drawn.items()) for sid, step in self.steps.items()}

    def hand_over(self, to: Any) -> None:
        """The primary died, ``to`` is the new one: the draws this replica holds go to it."""
        self.send(to, DrawsHeld(self.own, self.held()))

    def promote(self, host: Any, held: list) -> None:
        """This replica is the primary now. First it takes the draws the others ``held`` (those
        the dead primary gave them and not it), then it draws what still waits (see
        :meth:`ReplicaDraws.promote`), sends every draw it holds to the others (each takes what it
        waits for), and writes every entry its logs hold before it goes on."""
        for sid, step in self.steps.items():
            for steps in held:
                out = step.replica.given(step, steps.get(sid, ()))
                if out:
                    host.guarded(self.rt.process_outputs, sid, out)
            out = step.replica.promote(step, self._publisher(sid))
            if out:
                host.guarded(self.rt.process_outputs, sid, out)
        self.sync(*self.followers())
        logs = host.output_logs
        if logs is not None and logs.segments:
            for step in self.steps.values():
                log = step.log
                log.pending = list(log.emitted.items())
                log.appended += len(log.pending)
            logs.write_all()

    def sync(self, *to: Any) -> None:
        """Every draw still held goes to ``to`` (the others after a promotion; a replacement
        replica, whose restore's log lacks those above the watermark, perhaps not durable yet)."""
        for sid, entries in self.held().items():
            for where in to:
                self.send(where, Drawn(sid, entries, self.own, whole=self.rt.watermark))

    def counts(self) -> dict:
        """Per declared step's name: inputs drawn here and inputs that took a draw given."""
        return {step.name: {"drawn": step.replica.drawn_count, "taken": step.replica.taken} for step in self.steps.values()}
