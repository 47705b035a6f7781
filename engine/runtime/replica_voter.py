"""A replica's side of ``verify="majority"`` and ``"sample:N"`` on Ray (issue 58, design item 5):
what one stage actor of a replicated instance digests and, under majority, if it is the primary,
holds back until the votes pass. The acker's tally is :mod:`driftstream.ordering.epoch_votes`; the actors' glue is in
:mod:`.replica_actors`; what the simulator does alike is :mod:`.simulated_votes`.

- Every replica gets every snapshot's marker (the secondaries take no snapshot: a marker only
  ends an epoch for them) and, at the run's end, the last watermark. At each it digests its
  folded keyed state (:func:`~.replica_votes.host_state_digest`: the same watermark, the same
  state) and, once its sinks released everything below the marker, sends the acker its digest
  of the epoch: that state, what its sinks released in it and the net of what it sent
  (:class:`~driftstream.ordering.replica_digests.ReplicaDigest`).
- The primary's released bundles wait in a gate (taken as written meanwhile: one bundle in
  flight per sink would hold the epoch's later releases, and its digest, back) until the acker
  says every instance passed their epochs (:class:`~.protocol.GateOpen`); then they go to the
  sink writers. Its snapshot parts wait until the gate's writes below their time are
  acknowledged: a committed snapshot then says, as without votes, that the sinks hold what is
  below it, and every committed snapshot is certified by the votes.
- Under ``"sample:N"`` (``sample`` = N) there is no gate: the primary's bundles go to its sinks'
  writers at once (the actor's), and only the epochs whose end
  :func:`~driftstream.ordering.epoch_votes.sampled` picks are digested and voted, after their
  output left (the others: no state listed, no message). The primary's part of a sampled
  snapshot still waits for the vote (:class:`~.protocol.GateOpen` past its time), so a committed
  sampled snapshot is certified; the others' parts go at once.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import InstanceConfig
>>> from driftstream.engine.runtime.instance_host import InstanceHost
>>> from driftstream.engine.runtime.stage_snapshots import StageSnapshots
>>> from driftstream.engine.testing import MemorySink, MemorySource
>>> f = Flow("voter")
>>> f.source(MemorySource([1, 2])).key_by(str).stateful_map(lambda s, x: ((s or 0) + x, x)).sink(MemorySink("o"))
>>> plan, sent, written = f.plan(1), [], []
>>> key = plan.instances[0]
>>> host = InstanceHost(plan, key, InstanceConfig(), StageSnapshots(None, plan.participant(key), None), send=None, incarnations={key: 4}, incarnation=4)
>>> voter = EpochVoter(host, 4, True, sent.append, lambda sid, sink, bundle: written.append(bundle))
>>> voter.marks[7] = (5,); host.apply_watermark((5,)); voter.marker(7, (5,)); [(type(m).__name__, m.snapshot_id) for m in sent]
[('EpochDigest', 7)]
>>> voter.open((5,)); voter.part(Prepared(7, tuple(key), {})); sent[-1].snapshot_id, voter.drained()
(7, False)
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any, Callable, Optional

from driftstream.barriers.bundle import Bundle
from driftstream.ordering.epoch_votes import sampled
from driftstream.ordering.meta import BOTTOM, TOP
from driftstream.ordering.replica_digests import Epochs, ReplicaDigest

from driftstream.engine.runtime.protocol import EpochDigest, Prepared
from driftstream.engine.runtime.replica_votes import DigestedLog, host_state_digest


class EpochVoter:
    """Replica ``incarnation`` of ``host``'s instance (``primary``: it is the primary): its
    digests per epoch, sent with ``send(message)`` (to the acker), and, while it is the
    primary, its gate; ``write(sid, sink, bundle)`` hands a bundle the gate let through to its
    sink's writer, which calls :meth:`written` once the sink has it. ``sample``: N of
    ``verify="sample:N"`` (None: majority's, every epoch voted and the gate)."""

    def __init__(self, host: Any, incarnation: Any, primary: bool, send: Callable[[Any], None],
                 write: Callable[[int, Any, Bundle], None], sample: Optional[int] = None) -> None:
        self.host, self.incarnation, self.primary, self.send, self.write = host, incarnation, primary, send, write
        self.sample = sample
        self.epochs = Epochs()
        self.digest = ReplicaDigest(self.epochs)
        host.recovery.log = DigestedLog(self.digest)  # empty still: the instance has sent nothing
        self.ends: deque = deque()  # (snapshot id, t, epoch index or None, state digest), waiting for the sinks
        #: snapshot id -> its marker's t (set before the host takes the marker: its part may be ready at once)
        self.marks: dict = {}
        #: the primary's bundles the votes have not passed yet, ``(sink step id, sink, bundle)``
        self.gate: list = []
        self.open_through: tuple = BOTTOM
        self.writing: list = []  # the first element's time of each bundle handed to a sink, not yet acknowledged
        self.parts: deque = deque()  # (t, Prepared) waiting for the gate's writes below t

    # -- the digests ------------------------------------------------------------------------

    def released(self, sid: int, bundle: Bundle) -> None:
        """Sink step ``sid`` released ``bundle`` (a secondary's is kept, the primary's gated)."""
        self.digest.released(sid, bundle.elements)

    def marker(self, snapshot_id: Optional[int], t: tuple) -> None:
        """The host took snapshot ``snapshot_id``'s marker at ``t`` (None, at TOP: the run's
        last watermark): an epoch ends; its digest goes once the sinks released what is below ``t``."""
        boundaries = self.epochs.boundaries
        if t == TOP:
            k: Optional[int] = len(boundaries)
        elif not boundaries or t > boundaries[-1]:
            self.epochs.add(t)
            k = len(boundaries) - 1
        else:
            k = None  # a marker at the last one's time: an empty epoch, voted on the state alone
        state = host_state_digest(self.host) if sampled(snapshot_id, self.sample or 1) else None  # (None: not voted)
        self.ends.append((snapshot_id, t, k, state))
        self.report()

    def report(self) -> None:
        """Send the digests of the epochs whose output below their end the sinks released."""
        ends = self.ends
        if not ends:
            return
        durable = self.host.rt.sinks.output_durable_through()
        while ends and ends[0][1] <= durable:
            snapshot_id, _, k, state = ends.popleft()
            if state is None:  # sample:N, an epoch not sampled: its hashes go unsent
                if k is not None:
                    self.digest.forget(k)
                continue
            if k is None:
                digest = hashlib.blake2b(state.encode(), digest_size=16).hexdigest()
            else:
                self.digest.ended(k, state)
                digest = self.digest.digest(k)
                self.digest.forget(k)
            self.send(EpochDigest(tuple(self.host.key), self.incarnation, snapshot_id, digest))

    # -- the gate (the primary) ----------------------------------------------------------------

    def hold(self, sid: int, sink: Any, bundle: Bundle) -> None:
        """The primary's ``bundle`` for sink step ``sid`` waits for the votes of its epochs."""
        self.gate.append((sid, sink, bundle))
        self._open()

    def open(self, t: tuple) -> None:
        """Every instance passed the epochs below ``t`` (:class:`~.protocol.GateOpen`)."""
        if t > self.open_through:
            self.open_through = t
            if self.primary:
                self._open()

    def _open(self) -> None:
        """Write what the gate holds below ``open_through`` (a bundle across it is split)."""
        through, keep = self.open_through, []
        for sid, sink, bundle in self.gate:
            if bundle.t_last < through:
                self._write(sid, sink, bundle)
            elif bundle.elements[0][0] < through:
                self._write(sid, sink, Bundle([e for e in bundle.elements if e[0] < through]))
                keep.append((sid, sink, Bundle([e for e in bundle.elements if not e[0] < through])))
            else:
                keep.append((sid, sink, bundle))
        self.gate = keep
        self._send_parts()

    def _write(self, sid: int, sink: Any, bundle: Bundle) -> None:
        self.writing.append(bundle.elements[0][0])
        self.write(sid, sink, bundle)

    def written(self, bundle: Bundle) -> None:
        """The sink acknowledged ``bundle`` (one :meth:`write` gave it)."""
        self.writing.remove(bundle.elements[0][0])
        self._send_parts()

    def part(self, message: Prepared) -> None:
        """The primary's snapshot part ``message`` goes once the gate's writes below its time are
        acknowledged (now, or later): a committed snapshot says the sinks hold what is below it.
        Under sample:N a part of a snapshot not sampled goes without waiting (no vote certifies it)."""
        t = self.marks[message.snapshot_id] if sampled(message.snapshot_id, self.sample or 1) else BOTTOM
        self.parts.append((t, message))
        self._send_parts()

    def _send_parts(self) -> None:
        parts = self.parts
        while parts and parts[0][0] <= self.open_through and all(not first < parts[0][0] for first in self.writing):
            self.send(parts.popleft()[1])

    def drained(self) -> bool:
        """Whether the gate let everything through to the end and the sinks have it."""
        return self.open_through == TOP and not self.gate and not self.writing

    def promoted(self, held: list) -> None:
        """This replica is the primary now: ``held`` (``(sink step id, sink, bundle)`` it kept
        that the sinks lack) goes through its gate first."""
        self.primary = True
        self.gate = list(held) + self.gate
        self._open()
