"""Silent corruption injected into voting replicas in the simulator (issue 58, design item 4):
one bit of one settled value of a replica's keyed state flipped, and how each flip ended.
:class:`~.simulated_votes.SimulatedVotes` owns one and tells it what its votes found.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import RunConfig
>>> from driftstream.engine.runtime.simulator import Simulation
>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> f = Flow("flips")
>>> f.source(MemorySource(range(40), partitions=2)).key_by(lambda x: x % 2).stateful_map(lambda s, x: ((s or 0) + x,) * 2).sink(MemorySink("o"))
>>> config = RunConfig(seed=5, guarantee="exactly-once", snapshot_interval=0.004, recovery="local", replicas=3, verify="majority")
>>> sim = Simulation(f.plan(2), config, replica_flips=1)
>>> _ = sim.run(); [(flip.step, flip.found) for flip in sim.votes.flips]
[('stateful_map', 'detected')]

Costs: :meth:`SimulatedFlips.flip` sorts the replica's settled keys (tests' states are small);
:meth:`SimulatedFlips.found` is O(flips).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from driftstream.ordering.keyed_state import DriftingKeyedState
from driftstream.ordering.meta import TOP
from driftstream.ordering.replica_digests import flipped

from driftstream.engine.model.plan import Instance, Plan
from driftstream.engine.runtime.replica_votes import keyed_states


@dataclass
class Flip:
    """A value flipped in replica ``incarnation`` of ``instance``: step ``step``'s settled
    state of ``key``, ``old`` -> ``new``, at its watermark ``t``. ``found``: how it ended, a
    dissent that named the replica ("detected"), or the replica gone first ("rolled back",
    "died", "rescaled": restarted at another parallelism) before a vote saw it; "" while it is live."""

    instance: Instance
    incarnation: Any
    step: str
    key: Any
    old: Any
    new: Any
    t: tuple
    found: str = ""
    primary: bool = False  # the replica was the primary then (its output went to the sinks)


class SimulatedFlips:
    """The flips of one run's replicas (``replicas``: its :class:`~.simulated_replicas.SimulatedReplicas`):
    ``flips``, every :class:`Flip` in order."""

    def __init__(self, plan: Plan, replicas: Any) -> None:
        self.plan, self.replicas = plan, replicas
        self.flips: list = []
        self._flipped: set = set()  # (incarnation, step id, key): each value once

    def seeded(self, rng: random.Random) -> bool:
        """A seeded replica of an instance with all its replicas gets a flip (see :meth:`flip`).
        Whether one was flipped."""
        whole = self.replicas.whole()
        return bool(whole) and self.flip(rng.choice(whole), rng) is not None

    def flip(self, inc: Any, rng: random.Random) -> Optional[Flip]:
        """Flip one bit of a seeded key's value in replica ``inc``'s value state or a window's
        open state (see :func:`flip_key`). None: it has none to flip."""
        instance, host = self.replicas.hosts[inc]
        if host.rt.watermark == TOP or any(not f.found and f.instance == instance for f in self.flips):
            return None  # its last state digest is taken; or a second corrupt replica could outvote a good one
        states = dict(keyed_states(host))
        choices = [(sid, key) for sid, ks in sorted(states.items()) if isinstance(ks, DriftingKeyedState) and hasattr(ks.backend, "items")
                   for key, _ in sorted(ks.backend.items(), key=repr) if (inc, sid, key) not in self._flipped]
        rng.shuffle(choices)
        for sid, key in choices:
            changed = flip_key(states[sid], key)
            if changed is not None:
                break
        else:
            return None
        self._flipped.add((inc, sid, key))  # once: a second flip of one value would undo the first
        done = Flip(instance, inc, self.plan.steps[sid].name, key, *changed, host.rt.watermark, primary=self.replicas.sets[instance][0] == inc)
        self.flips.append(done)
        return done

    def found(self, incs: list, how: str) -> None:
        """The live flips of replicas ``incs`` ended ``how`` (a vote named them, they died...)."""
        for flip in self.flips:
            if not flip.found and flip.incarnation in incs:
                flip.found = how


def flip_key(ks: DriftingKeyedState, key: Any) -> Optional[tuple]:
    """Flip ``key``'s settled value in ``ks`` and every state its log holds above the watermark
    (else a fold, or a late element's re-application, would bring the old back). ``(old, new)``
    of its latest state; None: it has no settled value to flip (a flip of its log alone would
    be undone by a late element's re-application from the settled value)."""
    settled = ks.backend.get(key)
    if flipped(settled) is None:
        return None
    log = ks.logs.get(key)
    after = [] if log is None else [i for i, a in enumerate(log.after) if a is not None and flipped(a) is not None]
    ks.backend.put(key, flipped(settled))
    for i in after:
        log.after[i] = flipped(log.after[i])
    old = flipped(log.after[after[-1]]) if after else settled
    return old, flipped(old)
