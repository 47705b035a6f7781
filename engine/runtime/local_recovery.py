"""Local recovery in the simulator (``recovery="local"``, issue 58): one instance fails, only
it restores the newest committed snapshot, and the others go on without rolling back.

What a failure of instance X does, in one scheduling step (:meth:`LocalRecovery.fail`):

1. Every other instance sends what it holds for others; then X, and every message to or
   from it, is lost (its sink writes too: the process died before they landed).
2. The acker (a :class:`~driftstream.ordering.channel_tables.ChannelAcker`) discards the
   tables of X's incarnation and drops whatever still comes for them, a source's bound
   included; a source instance's bound is unknown again. ``W``, the watermark then, is the
   cut: below it X's output is settled and every receiver has it.
3. Each survivor, under a hold of the acker at ``T`` until its :class:`ReplaySent` (behind
   the Ack of what follows), processes what its input merge held back, cancels what the dead
   incarnation sent it at or above ``W``
   (:class:`~driftstream.ordering.unsettled_inputs.UnsettledInputs`: tombstones, or the
   element of a lone tombstone) and re-sends from its log what it sent X since ``T``
   (:class:`~driftstream.ordering.upstream_log.UpstreamLog`), as new batches of the
   replacement's channel.
4. The replacement restores snapshot ``T`` and drops its own output below ``W`` (logging it).
5. Until it catches up, the replacement is told the acker's raw frontier (what is open
   below the watermark the others are past: its replay) and no watermark (one sent before
   the failure may still be on its way through an acker shard); it catches up when the
   frontier meets the watermark. No snapshot begins meanwhile, and a failure meanwhile
   falls back to a global rollback (the replacement's log is whole only once it caught up;
   :meth:`LocalRecovery.restart_all`).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("local")
>>> f.source(MemorySource(range(6), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> plan = f.plan(2)
>>> local = LocalRecovery(plan)
>>> local.incarnations[plan.instances[2]], local.replace(plan.instances[2]), local.incarnations[plan.instances[2]]
(2, (2, 4), 4)
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

from driftstream.ordering.channel_tables import ChannelAcker
from driftstream.ordering.meta import BOTTOM
from driftstream.ordering.receiver_frontiers import ReceiverFrontiers

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.instance_recovery import catch_up


class LocalRecovery:
    """The run's side of ``recovery="local"``: each instance's current incarnation
    (``incarnations``, shared with the stage runtimes), each live incarnation's side
    (``parts``: its host's :class:`~.instance_recovery.InstanceRecovery`: log, inputs taken,
    cut), the replacements catching up (``catching_up``: instance -> the watermark it was
    told) and ``restores`` per instance."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        #: each instance's upstream cone and downstream (a frontier per receiver while one recovers)
        self.cones = plan.cones()
        self.incarnations: dict = {key: n for n, key in enumerate(plan.instances)}
        self._next = len(plan.instances)
        self.parts: dict = {}
        self.catching_up: dict = {}
        self.restores: Counter = Counter()
        #: items re-sent from logs, and undone at receivers (tombstones or lone tombstones' elements), over the run
        self.replayed = self.cancelled = 0

    def busy(self, acker: AckerHost) -> bool:
        """A recovery is under way: a replacement catches up, or the instances are still told
        frontiers of their own (no snapshot may begin, and a failure falls back to global)."""
        return bool(self.catching_up) or acker.frontiers is not None

    def replace(self, instance: Instance) -> tuple:
        """``instance`` failed: a new incarnation id for its replacement; ``(old, new)``."""
        old, new = self.incarnations[instance], self.new_incarnation()
        self.incarnations[instance] = new
        return old, new

    def new_incarnation(self) -> int:
        """A fresh incarnation id (a replacement's, or a replica's)."""
        self._next += 1
        return self._next - 1

    def restart_all(self, plan: Optional[Plan] = None) -> None:
        """Every instance restarts from one snapshot (the fallback, a global rollback for a
        failure while a replacement catches up; or a rescale to ``plan``): each a new
        incarnation, with a new acker; logs and inputs start empty and fill again from the
        snapshot every instance restores."""
        self.plan = plan or self.plan
        self.cones = self.plan.cones()
        self.incarnations.clear()  # the same dict: the stage runtimes read it
        for key in self.plan.instances:
            self.incarnations[key] = self._next
            self._next += 1
        self.parts.clear()
        self.catching_up.clear()

    def started(self, instance: Instance, host: Any) -> None:
        """A new incarnation of ``instance`` starts (``host``: with an empty log, nothing taken)."""
        self.parts[instance] = host.recovery

    def trim(self, t: tuple) -> None:
        """Snapshot ``t`` committed: a restore starts there, the logs keep what is at or after it."""
        for part in self.parts.values():
            part.trim(t)

    # -- the acker's side ------------------------------------------------------------------

    def catch_up(self, table: ChannelAcker, pushed: tuple, send: Callable[[Any, Any], None]) -> None:
        """Tell each replacement catching up the raw frontier if it moved; one whose frontier
        met the watermark the others were told (``pushed``), with no replay pending, has caught up."""
        catch_up(table, self.catching_up, self.incarnations, pushed, send)

    # -- a failure -----------------------------------------------------------------------------

    def fail(self, victim: Instance, incarnation: Any, manifest: Optional[Manifest], restart: Callable[[Instance, Optional[Manifest]], Any],
             in_place: bool = False, peers: Optional[list] = None) -> int:
        """``victim`` fails (see the module doc); ``incarnation``: the run's
        :class:`~.simulated_incarnation.SimulatedIncarnation`; ``restart(instance, manifest)``
        starts the replacement from ``manifest`` (None: the beginning) and returns its host;
        ``in_place``: it is reset in place, its sink writes in progress land first. ``peers``:
        who takes a part, ``(the token of its ReplaySent, host, whether it re-sends its log)``
        (default: every other live instance, named by its key; with replicas, see
        :meth:`~.simulated_replicas.SimulatedReplicas.peers_of`). Returns how many landed."""
        live, table = incarnation.live, incarnation.acker.table
        if peers is None:
            peers = [(key, host, True) for key, host in live.hosts.items() if key != victim]
        for _, host, _ in peers:
            host.flush()
        collecting = incarnation.acker.collecting
        if collecting is not None:  # its part may be lost with the victim: given up, as a failed store's
            incarnation.acker.end_snapshot(collecting.snapshot_id)
        host = live.hosts[victim]
        live.stop_one(victim)
        landed = incarnation.land_writes({victim: host}) if in_place else 0
        incarnation.lose(victim)
        cut = table.watermark
        old, new = self.replace(victim)
        table.discard(old)
        if victim in self.plan.source_instances:
            table.reset_bound(self.plan.source_instances.index(victim))
        restart(victim, manifest)
        self.parts[victim].cut = cut
        self.restores[victim] += 1
        t = BOTTOM if manifest is None else tuple(manifest.t)
        # Told nothing yet, not T: a restored window's timer at T holds the frontier at T, and
        # fires only once the replacement is told T itself.
        self.catching_up[victim] = BOTTOM
        for token, host, replays in peers:
            self._recover(token, host, replays, victim, new, cut, t, incarnation)
        self.catch_up(table, incarnation.acker.pushed, lambda to, m: incarnation.enqueue("acker", to, m))
        # The others are told their own frontiers until the replacement's downstream is back with them.
        owners = {inc: key for key, inc in self.incarnations.items()}
        incarnation.acker.diverge(ReceiverFrontiers(table, self.cones, victim, owners, self.plan.source_instances, incarnation.acker.pushed,
                                                    self.catching_up))
        return landed

    def _recover(self, token: Any, host: Any, replays: bool, victim: Instance, new: int, cut: tuple, t: tuple, incarnation: Any) -> None:
        """A survivor's part (``host``, its ReplaySent named ``token``), under a hold at ``t``
        until that :class:`ReplaySent` (behind the Ack of what it did) reaches the acker: the
        discarded tables no longer hold what it still sends for the dead incarnation's items.
        It processes what its input merge held back (of the dead sender too: their batches'
        holds were discarded), cancels what the dead incarnation sent it at or above ``cut``,
        and (``replays``) re-sends what it logged for ``victim`` since ``t``."""
        incarnation.acker.table.hold((new, token), t)
        part = host.recovery
        replayed, cancelled = part.replayed, part.cancelled
        host.peer_failed(victim, new, cut, incarnation.batch_size, replay=replays, since=t)
        self.replayed += part.replayed - replayed
        self.cancelled += part.cancelled - cancelled
