"""The data-plane messages of a run: what the stage actors, the acker and the supervisor's
snapshot inbox send each other (:mod:`.transport` frames and pickles them).

Small named tuples: one type per message, dispatched on the type, pickled as a tuple and
a class reference.

========================  =========================  ==============================================
message                   from -> to                 meaning
========================  =========================  ==============================================
:class:`Push`             stage -> stage             a batch of elements for the receiver's steps
:class:`Ack`              stage -> acker             XORs per time, and the source's new bound
:class:`Watermark`        acker -> stage             everything below ``t`` is settled; with a
                                                     ``snapshot_id``: the marker of snapshot T
:class:`Told`             acker -> acker shard       ``recovery="local"``, an instance's own frontier
                                                     while one recovers: the shard passes it on
:class:`Align`            acker -> source stage      the least bound over every source instance
                                                     (aligned sources, see connectors/alignment.py)
:class:`Prepared`         stage -> acker             this instance's part of a snapshot is durable
:class:`ShardFlush`       acker shard -> acker       the net XORs of whole flushes of the shard's
                                                     instances, their sources' newest bounds and
                                                     snapshot parts (ordering/ack_shards.py)
:class:`SnapshotTaken`    acker -> supervisor        every part of a snapshot is in
:class:`ScheduleEnded`    acker -> supervisor        a schedule of snapshots ended
:class:`ReplaySent`       stage -> acker             ``recovery="local"``: its part in a peer's
                                                     recovery is sent (behind that Ack)
:class:`EpochDigest`      replica -> acker           ``verify="majority"``: its digest of an epoch
:class:`GateOpen`         acker -> replicas          every instance passed the epochs below ``t``
:class:`Expelled`         acker -> replica           outvoted: it leaves the run
========================  =========================  ==============================================

>>> Watermark((5,)).snapshot_id is None, Watermark((5,), 3).snapshot_id
(True, 3)
>>> import pickle; pickle.loads(pickle.dumps(Prepared(3, (1, 0), {"sources": {}})))
Prepared(snapshot_id=3, instance=(1, 0), part={'sources': {}})
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional


class Push(NamedTuple):
    """A batch (:class:`~driftstream.engine.runtime.stage.Batch`) for the receiving instance."""

    batch: Any


class Ack(NamedTuple):
    """A stage instance's flush: ``xors`` (time -> XOR of ids), and if it reads a source, its
    index among the source instances and its new bound (None: unchanged)."""

    xors: dict
    source_index: Optional[int]
    bound: Optional[tuple]


class Watermark(NamedTuple):
    """The acker's watermark ``t``; with ``snapshot_id``, snapshot ``snapshot_id`` is taken at ``t``."""

    t: tuple
    snapshot_id: Optional[int] = None


class Told(NamedTuple):
    """``recovery="local"``, acker -> the acker shard that relays to instance ``to``: ``to``'s own
    frontier ``t`` while an instance recovers, which the shard passes on as a :class:`Watermark`.
    Through the shard, not straight to ``to``: it must come after the watermarks and markers the
    shard still has to pass on (straight, it overtook them: a replica then digested an epoch's
    end at a watermark past it, and was outvoted though nothing was corrupt)."""

    to: Any
    t: tuple


class Align(NamedTuple):
    """The frontier: the least bound over every source instance (aligned sources read up to a
    slack past it)."""

    frontier: tuple


class Prepared(NamedTuple):
    """``instance`` (``(stage index, instance)``) answers snapshot ``snapshot_id`` with its ``part``."""

    snapshot_id: int
    instance: tuple
    part: dict


class ShardFlush(NamedTuple):
    """An acker shard's batch (:class:`~driftstream.ordering.ack_shards.ShardBatch`) for the root
    acker: ``xors`` (time -> net XOR), ``bounds`` (source index -> newest bound), the number of
    ``flushes`` folded in, and the :class:`Prepared` ``parts`` that came with them, in order."""

    xors: dict
    bounds: dict
    flushes: int
    parts: list


class SnapshotTaken(NamedTuple):
    """A snapshot of schedule ``stream``: ``(id, T, parts, missing, started, took_s)``."""

    stream: int
    snapshot: tuple


class ScheduleEnded(NamedTuple):
    """Schedule ``stream`` sends nothing more."""

    stream: int


class ReplaySent(NamedTuple):
    """``recovery="local"``: instance ``sender`` -> acker, behind the :class:`Ack` of its part in
    incarnation ``receiver``'s recovery (its cancels, the batches it re-sent): the acker's hold
    for it goes."""

    receiver: Any
    sender: Any


class EpochDigest(NamedTuple):
    """``verify="majority"``: replica ``replica`` of ``instance`` -> acker, its ``digest`` of the
    epoch that ends at snapshot ``snapshot_id``'s marker (None: the run's last watermark)."""

    instance: tuple
    replica: Any
    snapshot_id: Any
    digest: str


class GateOpen(NamedTuple):
    """``verify="majority"``: acker -> every replica, every instance passed the epochs below ``t``:
    a primary's sinks may be given its output below ``t``."""

    t: tuple


class Expelled(NamedTuple):
    """``verify="majority"``: acker -> a replica a majority outvoted: it leaves the run (``why``)."""

    why: str


class Drawn(NamedTuple):
    """``replicas`` > 1: the primary (incarnation ``sender``) -> each other replica of its
    instance, what step ``step`` (declared ``deterministic=False``) drew: ``[(key, outputs)]``,
    the key an input's Meta and its payload's ``repr`` (see replica_draws.py); the others take
    these instead of drawing."""

    step: int
    entries: list
    sender: Any
    #: every draw the primary holds, and its watermark then (a replacement's first: till then it
    #: takes nothing from its log, and then only below that watermark); None: new draws
    whole: Any = None


class DrawsHeld(NamedTuple):
    """``replicas`` > 1, the primary died: replica ``sender`` -> the new primary, the draws it
    holds, step id -> ``[(key, outputs)]`` (some it took from the dead one the new one may lack)."""

    sender: Any
    steps: dict
