"""Faults a test injects into a stage instance's keyed state, on Ray (``StageActor.inject_fault``)
and in the simulator (issue 58, ``verify="reexecute:N"``): :func:`flip_settled` flips a bit of
a settled value behind the engine's back (memory corruption), :func:`wrong_once` makes the next
call of a keyed step's function give a wrong result once (a CPU error).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.model.config import InstanceConfig
>>> from driftstream.engine.runtime.instance_host import InstanceHost
>>> from driftstream.engine.runtime.stage_snapshots import StageSnapshots
>>> from driftstream.engine.testing import MemorySink, MemorySource
>>> f = Flow("faults")
>>> f.source(MemorySource([1, 2])).key_by(str).stateful_map(lambda s, x: ((s or 0) + x, x)).sink(MemorySink("o"))
>>> plan = f.plan(1)
>>> key = plan.instances[0]
>>> host = InstanceHost(plan, key, InstanceConfig(), StageSnapshots(None, plan.participant(key), None), send=lambda *m: None)
>>> host.guarded(host.rt.process_source, host.reader.poll(2)); host.rt.on_watermark((9,))
True
>>> flip_settled(host, random.Random(0))
Fault(kind='flip', instance=Instance(stage=0, index=0), step='stateful_map', key='1', old=1, new=0)
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Optional

from driftstream.ordering.entry_state import EntryKeyedState
from driftstream.ordering.replica_digests import flipped
from driftstream.ordering.written_digests import CheckedEntries


@dataclass
class Fault:
    """A fault injected into instance ``instance``'s step ``step``: ``kind`` is ``"flip"`` (a
    settled value of ``key``, ``old`` -> ``new``) or ``"wrong"`` (its function's next result)."""

    kind: str
    instance: Any
    step: str
    key: Any = None
    old: Any = None
    new: Any = None


def _records(ks: Any, rest: bool) -> list:
    """The settled records of ``ks`` a flip may strike (``rest``: of keys with no log): a value
    state's keys (the same choice checked or not, so a test can see what the flip does
    unchecked), a checked entry state's records with a digest (an unchecked entry backend lists
    none)."""
    logs = ks.logs if rest else {}
    if isinstance(ks.backend, CheckedEntries):
        return sorted((r for r in ks.backend.written if r[0] not in logs), key=repr)
    backend = getattr(ks.backend, "inner", ks.backend)
    return [] if isinstance(ks, EntryKeyedState) else sorted((key for key, _ in backend.items() if key not in logs), key=repr)


def flip_settled(host: Any, rng: random.Random, rest: bool = False) -> Optional[Fault]:
    """Flip one bit of a seeded settled record of ``host``'s keyed state in its backend itself
    (under ``verify="reexecute:N"`` behind the digests' back), and of every state above the
    watermark that derives from it (a value key's log, an entry's overlay stack): else the next
    fold would write the right value over it. ``rest``: of a key at rest (no log: its next
    element reads the settled value). None: nothing to flip."""
    choices = [(sid, ks, record) for sid, ks in sorted(host.rt.keyed.items()) for record in _records(ks, rest)]
    rng.shuffle(choices)
    for sid, ks, record in choices:
        inner = getattr(ks.backend, "inner", ks.backend)
        old = inner.get(record)
        if flipped(old) is None:
            continue
        if isinstance(ks, EntryKeyedState):
            inner.fold([(record, flipped(old))])
            stack = ks.overlay.get(record, [])
        else:
            inner.put(record, flipped(old))
            log = ks.logs.get(record)
            stack = [] if log is None else log.after
        for i, value in enumerate(stack):
            if flipped(value) is not None:
                stack[i] = flipped(value)
        return Fault("flip", host.key, host.rt.plan.steps[sid].name, record, old, flipped(old))
    return None


def wrong_once(host: Any, rng: random.Random) -> Optional[Fault]:
    """The next call of a seeded keyed step's function of ``host`` gives a wrong result once: a
    value state's new state and output flipped, an entry state's output. None: no keyed step."""
    steps = sorted(host.rt.keyed.items())
    if not steps:
        return None
    sid, ks = rng.choice(steps)
    fn, entries, done = ks.fn, isinstance(ks, EntryKeyedState), []

    def wrong(state: Any, element: Any) -> Any:
        result = fn(state, element)
        if done:
            return result
        done.append(True)
        if entries:
            return result if flipped(result) is None else flipped(result)
        new, out = result
        return (new if flipped(new) is None else flipped(new)), (out if flipped(out) is None else flipped(out))

    ks.fn = wrong
    return Fault("wrong", host.key, host.rt.plan.steps[sid].name)


#: the faults by name, as ``StageActor.inject_fault`` takes them
FAULTS: dict = {"flip": flip_settled, "flip at rest": functools.partial(flip_settled, rest=True), "wrong": wrong_once}
