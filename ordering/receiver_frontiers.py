"""A frontier per receiver while one instance recovers locally (``recovery="local"``, issue 58).

With one watermark for the run, a failed instance's recovery stops every sink: the watermark
stays at the cut ``W`` until the replacement has processed its replay up to ``W``. But an
instance's output only waits for what can still reach it: the least open time over its
*upstream cone* (:class:`Cones`: the instances with a path to it, itself included), i.e. over
the channels into those instances (a :class:`~.channel_tables.ChannelAcker` table keyed
``(sender, receiver)``), their timers (the table of a channel to itself), the holds put for a
receiver (a recovery's, keyed ``(receiver incarnation, ...)``) and the bounds of the sources
among them. The dead instance's channels are in the cones of its downstream only.

:class:`ReceiverFrontiers` is the acker's state for one recovery, from the failure until
every instance is back under one watermark. Each instance ``x`` is told the least open time
over ``reach(x)``: its cone and, outside the victim's downstream, the cones of its own
downstream instances too (so a source's credit still waits for its receivers: the sources
read on while the replacement catches up, as far as the others keep up). It never moves
back, and is at or above the global watermark (a least time over fewer tables).

Why only during a recovery: a snapshot's marker carries one ``T`` that every instance must
not have passed when it takes its part (its state folds below what it was told), and a
failure's cut ``W`` must be at or above what every receiver was told (a receiver ahead of it
has settled, and would get again, the replacement's output in between). So no snapshot
begins and no second local recovery is taken while frontiers differ; the recovery ends
(:attr:`ReceiverFrontiers.done`) once the global frontier has reached everything told. To get
there under a steady load, the frontiers stop at a target (:meth:`ReceiverFrontiers.converge`)
once the victim's downstream has caught up with the slowest other instance, or when a
snapshot is due and the replacement has caught up.

>>> cones = Cones({"s0": ["k0", "k1"], "s1": ["k0", "k1"], "k0": [], "k1": []})
>>> sorted(cones.upstream["k0"]), sorted(cones.downstream["s0"])
(['k0', 's0', 's1'], ['k0', 'k1', 's0'])
>>> from .channel_tables import ChannelAcker
>>> a = ChannelAcker(sources=2)
>>> a.update({}, source=(1, 1), bound=(9, 0, 1, 9))
(-inf,)
>>> a.update({((0, 2), (1, 0, 0, 1)): 5, ((1, 3), (4, 0, 1, 4)): 6}, source=(0, 0), bound=(9, 0, 0, 9))
(1, 0, 0, 1)
>>> a.hold((2, "s0"), (0, 0, 0, 1))      # k0 (incarnation 2) restores T = (0, 0, 0, 1): its replay holds it
>>> f = ReceiverFrontiers(a, cones, "k0", {0: "s0", 1: "s1", 2: "k0", 3: "k1"}, ["s0", "s1"], told=(1, 0, 0, 1))
>>> f.due()    # k1 and the sources need not wait for k0's open time 1; k0 still does
[('s0', (4, 0, 1, 4)), ('s1', (4, 0, 1, 4)), ('k1', (4, 0, 1, 4))]

Costs: :meth:`ReceiverFrontiers.due` is O(receivers + holds + sources + the sum over the
instances of their reach), amortised, once per push (the acker coalesces them); the table
keeps a heap per receiver meanwhile (a push per new open time). Nothing is kept or computed
outside a recovery. :class:`Cones` is O(instances x edges) once per plan.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Mapping, Optional, Sequence

from .channel_tables import ChannelAcker
from .meta import TOP, Time, successor

#: the receiver of an open time no instance is known for (a channel of an incarnation not in
#: the owners): it holds every instance, as the one watermark does
EVERY = object()


class Cones:
    """Per instance of a DAG of instances (``receivers``: instance -> the instances it sends to)
    its upstream cone and its downstream (each includes the instance itself)."""

    def __init__(self, receivers: Mapping[Hashable, Iterable[Hashable]]) -> None:
        down = {x: {x} for x in receivers}
        for x, to in receivers.items():
            for y in to:
                down.setdefault(y, {y})
        changed = True
        while changed:  # a fixpoint; plans are small (instances x edges per pass)
            changed = False
            for x, to in receivers.items():
                for y in to:
                    if not down[y] <= down[x]:
                        down[x] |= down[y]
                        changed = True
        #: instance -> the instances it has a path to, itself included
        self.downstream: dict = {x: frozenset(d) for x, d in down.items()}
        up: dict = {x: set() for x in down}
        for x, d in down.items():
            for y in d:
                up[y].add(x)
        #: instance -> the instances with a path to it, itself included
        self.upstream: dict = {x: frozenset(u) for x, u in up.items()}

    def reach(self, victim: Hashable) -> dict:
        """Per instance, the receivers whose open times hold what it is told while ``victim``
        recovers: its cone and the cones of its downstream that are on its side of the
        victim's downstream (outside it: the others' backlog still holds a source's credit)."""
        hit = self.downstream[victim]
        out = {}
        for x, d in self.downstream.items():
            side = x in hit
            out[x] = frozenset().union(*(self.upstream[y] for y in d if (y in hit) == side))
        return out


class ReceiverFrontiers:
    """The frontiers told during the local recovery of ``victim``, over ``table``'s open times.

    ``owners``: incarnation -> instance (the live ones; a channel to an incarnation not in it
    holds everyone); ``sources``: the instance of each source index; ``told``: what every
    instance was told before the failure; ``skip``: the instances told their frontier another
    way (a replacement catching up, read live: it is the caller's dict)."""

    def __init__(self, table: ChannelAcker, cones: Cones, victim: Hashable, owners: Mapping, sources: Sequence, told: Time,
                 skip: Optional[Mapping] = None) -> None:
        self.table, self.owners, self.sources, self.skip = table, owners, list(sources), {} if skip is None else skip
        self.victim = victim
        table.keep_receivers(True)
        self.reach = cones.reach(victim)
        self._others = [x for x in cones.downstream if x not in cones.downstream[victim]]
        #: instance -> the frontier it was told (never moves back)
        self.told: dict = {x: told for x in cones.downstream}
        #: the frontier nobody is told past (None: none yet; see converge)
        self.target: Optional[Time] = None
        #: converge once the replacement has caught up (a snapshot is due)
        self.converging = False
        #: every instance is under the one watermark again: the recovery's frontiers are over
        self.done = False

    def least_open(self) -> dict:
        """Receiver -> the least time still open for it (:data:`EVERY`: for every receiver)."""
        table, owners = self.table, self.owners
        least: dict = {}

        def add(r: Any, t: Time) -> None:
            if t < least.get(r, TOP):
                least[r] = t

        for receiver, t in table.least_by_receiver().items():
            add(owners.get(receiver, EVERY), t)
        for token, t in table.holds.items():
            add(owners.get(token[0], EVERY) if type(token) is tuple else EVERY, t)
        for i, bound in enumerate(table.bounds):
            add(self.sources[i], successor(bound))
        return least

    def frontiers(self) -> dict:
        """Instance -> the least open time over its reach (not clamped to what it was told)."""
        least = self.least_open()
        every = least.pop(EVERY, TOP)
        out = {}
        for x, reach in self.reach.items():
            f = every
            for r in reach:
                t = least.get(r)
                if t is not None and t < f:
                    f = t
            out[x] = f
        return out

    def converge(self) -> None:
        """Stop the frontiers at the highest told so far once the replacement has caught up (a
        snapshot is due): the global frontier reaches it, and the recovery ends. Before, the
        others would stop for the whole catch-up, as under one watermark."""
        self.converging = True

    def due(self) -> list:
        """``(instance, frontier)`` for each instance whose frontier moved (the last one, TOP, is
        the one watermark's); sets :attr:`done` once the global frontier has reached every
        frontier told (nothing is then due: the one watermark goes out)."""
        table, told, skip = self.table, self.told, self.skip
        g = table.frontier_raw()
        if not skip and g >= max(told.values()):
            self.done = True
            table.keep_receivers(False)
            return []
        frontiers = self.frontiers()
        if not skip and self.target is None and (self.converging or g >= min((told[x] for x in self._others), default=g)):
            self.target = max(told.values())  # a snapshot is due, or the victim's downstream is back with the slowest other
        cap = TOP if self.target is None else self.target
        out = []
        for x, f in frontiers.items():
            if f > cap:
                f = cap
            if f > told[x] and f < TOP and x not in skip:
                told[x] = f
                out.append((x, f))
        return out
