"""The steps of a fused stage as objects: one class per step kind behind one interface.

An operator takes a list of ``(meta, payload, key)`` items and returns its outputs
as the same triples; it raises :class:`StepError` naming the step and the element
when the user's function raises. ``count`` is the number of items it took (the
stage adds to it). :func:`~driftstream.engine.runtime.operator_registry.operator_for`
builds the operator of a plan step, with its state; :class:`DeadLettering` wraps a stateless one whose step has
``on_error="dead-letter"`` (stateful and timed steps divert inside their state,
where a failing element must also leave the key's state untouched).

>>> from driftstream.ordering.meta import Meta
>>> op = FlatMap("words", str.split)
>>> [(m[4], p) for m, p, _ in op.run([(Meta(0, 0, 0, 0), "a b", None)])]
[((0,), 'a'), ((1,), 'b')]
>>> DeadLettering(Map("inverse", lambda x: 1 / x)).run([(Meta(0, 0, 0, 0), 0, None)])[0][1].error
'ZeroDivisionError: division by zero'

Costs, per item: a stateless operator is one call of the user's function plus one
tuple; the stateful ones are those of their state (:mod:`driftstream.ordering`).
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Optional

from driftstream.barriers.barrier import Barrier
from driftstream.ordering.ack_table import AckTable
from driftstream.ordering.entry_state import MapState
from driftstream.ordering.keyed_state import StateFnError
from driftstream.ordering.meta import child_of
from driftstream.ordering.windows import Session
from driftstream.snapshots.state_keys import StateKeys, first

from driftstream.engine.model.errors import StepError, dead_letter, is_dead_letter, short_repr
from driftstream.engine.model.plan import Plan

def step_error(step_name: str, meta: Any, payload: Any, exc: BaseException) -> StepError:
    """The StepError of ``step_name`` failing on ``(meta, payload)`` (``exc`` itself if it is one).

    >>> str(step_error("parse", (0, 0, 0, 3, (), False), "x", ValueError("bad"))).splitlines()[0]
    "step 'parse' failed on element value 'x' (source 0, partition 0, offset 3): ValueError: bad"
    """
    if isinstance(exc, StepError):
        return exc
    return StepError(step_name, short_repr(payload), meta, f"{type(exc).__name__}: {exc}", traceback.format_exc())


class Operator:
    """One step of a stage. Subclasses implement :meth:`run`; a stateful one also its side
    of the watermark (:meth:`settle`, :meth:`on_watermark`: Bytewax's ``StatefulBatchLogic``
    is the model), which the stage calls on every operator alike."""

    __slots__ = ("name", "count")
    #: the keyed state snapshots hold for this step (None: it keeps none)
    state: Any = None
    #: whether its state closes on timers (its late elements are counted)
    timed = False
    #: a sink's barrier (None: not a sink)
    barrier: Optional[Barrier] = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def run(self, items: list) -> list:
        """The outputs of ``items``, ``(meta, payload, key)`` triples, in order."""
        raise NotImplementedError

    def settle(self, watermark: tuple) -> None:
        """Fold what ``watermark`` settled, before any timer of the stage fires. O(1) unless stateful."""

    def on_watermark(self, watermark: tuple) -> list:
        """The outputs of the timers ``watermark`` reached (closed windows), ``(meta, payload,
        key)`` triples, after the stage's :meth:`settle` calls. Empty unless timed."""
        return []


class Passthrough(Operator):
    """A source, ``key_by`` (the channel after it routes) or ``merge``: items go on as they are.

    >>> Passthrough("s").run([((0,), "x", None)])
    [((0,), 'x', None)]
    """

    __slots__ = ()

    def run(self, items: list) -> list:
        return items


class KeyBy(Operator):
    """A ``key_by`` in its input's stage (a fused plan, parallelism 1): each item goes on with
    ``fn(payload)`` as its key, as the keyed channel into an unfused one computes it (same
    errors; with ``divert``, an item ``fn`` raises on leaves as its dead letter keyed by the
    step's name, for the dead-letter split after it).

    >>> KeyBy("k", len, False).run([((0,), "ab", None)])
    [((0,), 'ab', 2)]
    """

    __slots__ = ("fn", "divert")

    def __init__(self, name: str, fn: Callable, divert: bool) -> None:
        super().__init__(name)
        self.fn, self.divert = fn, divert

    def run(self, items: list) -> list:
        fn, out = self.fn, []
        append = out.append
        try:
            for item in items:
                try:
                    append((item[0], item[1], fn(item[1])))
                except Exception as exc:
                    if not self.divert:
                        raise
                    append((item[0], dead_letter(self.name, item[0], item[1], exc), self.name))
        except Exception as exc:
            raise step_error(self.name, item[0], item[1], exc) from exc
        return out


class Stateless(Operator):
    """A map, flat_map or filter: ``fn`` per payload, no state.

    :meth:`one` is the same work for one item, calling ``fn`` in its own frame (a dead
    letter's traceback starts below it); :meth:`letter` is where an item's dead letter goes.
    """

    __slots__ = ("fn",)
    #: whether :meth:`run_batch` calls ``fn`` once for many items (see arrow_operators)
    batched = False

    def __init__(self, name: str, fn: Callable) -> None:
        super().__init__(name)
        self.fn = fn

    def one(self, item: tuple) -> list:
        raise NotImplementedError

    def letter(self, item: tuple, letter: Any) -> tuple:
        """The item that carries ``item``'s dead letter on (at ``item``'s own t)."""
        return (item[0], letter, None)


class Map(Stateless):
    """``fn(payload)`` per item.

    >>> Map("up", str.upper).run([((0,), "a", "k")])
    [((0,), 'A', None)]
    """

    __slots__ = ()

    def run(self, items: list) -> list:
        fn, out = self.fn, []
        append = out.append
        try:
            for meta, payload, _ in items:
                append((meta, fn(payload), None))
        except Exception as exc:
            raise step_error(self.name, meta, payload, exc) from exc
        return out

    def one(self, item: tuple) -> list:
        return [(item[0], self.fn(item[1]), None)]


class FlatMap(Stateless):
    """Each of ``fn(payload)``'s outputs, the k-th at the item's t with child id k appended."""

    __slots__ = ()

    def run(self, items: list) -> list:
        fn, out = self.fn, []
        append = out.append
        try:
            for meta, payload, _ in items:
                m0, m1, m2, m3, ids, m5 = meta  # child_of, inlined: once per output
                k = 0
                for value in fn(payload):
                    append(((m0, m1, m2, m3, ids + (k,), m5), value, None))
                    k += 1
        except Exception as exc:
            raise step_error(self.name, meta, payload, exc) from exc
        return out

    def one(self, item: tuple) -> list:
        meta = item[0]
        outputs = list(self.fn(item[1]))  # here, not in a comprehension's frame: a dead letter's traceback starts below one()
        return [(child_of(meta, k), value, None) for k, value in enumerate(outputs)]

    def letter(self, item: tuple, letter: Any) -> tuple:
        return (child_of(item[0], 0), letter, None)  # its first child's t


class Filter(Stateless):
    """The items whose payload ``fn`` keeps; a kept item keeps its key.

    >>> Filter("odd", lambda x: x % 2).run([((0,), 1, "a"), ((1,), 2, "b")])
    [((0,), 1, 'a')]
    """

    __slots__ = ()

    def run(self, items: list) -> list:
        fn, out = self.fn, []
        append = out.append
        try:
            for item in items:
                if fn(item[1]):
                    append(item)
        except Exception as exc:
            raise step_error(self.name, item[0], item[1], exc) from exc
        return out

    def one(self, item: tuple) -> list:
        return [item] if self.fn(item[1]) else []

    def letter(self, item: tuple, letter: Any) -> tuple:
        return (item[0], letter, item[2])


class DeadLettering(Operator):
    """A stateless operator whose step diverts: an item its function raises on leaves as its
    ``DeadLetter`` (a flat_map's: none of its other outputs; all or nothing)."""

    __slots__ = ("inner",)

    def __init__(self, inner: Stateless) -> None:
        super().__init__(inner.name)
        self.inner = inner

    def run(self, items: list) -> list:
        inner, out = self.inner, []
        if inner.batched:  # the whole batch at once, unless it raises: then one by one
            whole = inner.run_batch(items)
            if whole is not None:
                return whole
        one = inner.one
        for item in items:
            try:
                out += one(item)
            except Exception as exc:
                out.append(inner.letter(item, dead_letter(self.name, item[0], item[1], exc, engine_frames=2)))  # this frame and one()
        return out


class Keyed(Operator):
    """A stateful_map or stateful_flat_map: its :class:`~driftstream.ordering.keyed_state.DriftingLogs`
    state applies the batch per key in t order, repairing what arrived late."""

    __slots__ = ("state",)

    def __init__(self, name: str, state: Any) -> None:
        super().__init__(name)
        self.state = state

    def run(self, items: list) -> list:
        try:
            return self.state.apply_items(self.inputs(items))
        except StateFnError as exc:
            raise step_error(self.name, exc.meta, exc.payload, exc.__cause__) from exc.__cause__

    def inputs(self, items: list) -> list:
        return items

    def settle(self, watermark: tuple) -> None:
        self.state.advance(watermark)


class Lookup(Keyed):
    """A lookup join: both sides in one keyed state, each payload with its side (the input's tag)."""

    __slots__ = ()

    def inputs(self, items: list) -> list:
        return [(m, (m[4][-1], p), k) for m, p, k in items]  # the side: the last child id


class Timed(Operator):
    """A window, window join or interval join: state closed by timers, which hold the
    watermark through the acker (``acks()``: the stage's XORs to the acker, now)."""

    __slots__ = ("state", "acks")
    timed = True

    def __init__(self, name: str, state: Any, acks: Callable[[], AckTable]) -> None:
        super().__init__(name)
        self.state, self.acks = state, acks

    def run(self, items: list) -> list:
        try:
            return [(m, p, None) for m, p in self.state.apply_batch(items, self.acks())]
        except StateFnError as exc:  # the step's function or the timestamp function
            raise step_error(self.name, exc.meta, exc.payload, exc.__cause__) from exc.__cause__

    def on_watermark(self, watermark: tuple) -> list:
        """Fold, then fire the windows ``watermark`` closed (their timers' XORs go to the acks),
        each result at its window's close time."""
        state = self.state
        state.advance(watermark)  # here, not in settle(): as before, each window folds right before it fires
        return [(m, p, None) for m, p in state.fire(watermark, self.acks())]


class DeadLetterSplit(Operator):
    """The dead letters of the step before it (``failing``), counted in ``letters[failing]``
    (a tombstone of one takes it back)."""

    __slots__ = ("failing", "letters")

    def __init__(self, name: str, failing: str, letters: dict) -> None:
        super().__init__(name)
        self.failing, self.letters = failing, letters
        letters[failing] = 0

    def run(self, items: list) -> list:
        out = [item for item in items if is_dead_letter(item[1])]
        if out:
            self.letters[self.failing] += sum(-1 if item[0][5] else 1 for item in out)
        return out


class SinkStep(Operator):
    """A sink: its items wait in the barrier until the watermark passes them."""

    __slots__ = ("barrier", "sink")

    def __init__(self, name: str, barrier: Barrier, sink: Any) -> None:
        super().__init__(name)
        self.barrier, self.sink = barrier, sink

    def run(self, items: list) -> list:
        self.barrier.add_many(items)
        return []


class StepContext:
    """What building an operator needs from its stage instance: its plan and instance, a
    ``backend_factory(step name, fn, entries, state keys)`` (None: in-memory state), a
    ``sink_opener(step id, instance)`` (None: the sink opens a new partition), 64-bit seeds
    ``seed()``, the stage's acker XORs ``acks()``, the XORs restored timers hold
    (``seed_acks``), the per-step dead-letter counts (``dead_letters``) and the watermark of
    the snapshot the state is restored from (``restore_t``; None: none)."""

    def __init__(self, plan: Plan, instance: int, backend_factory: Optional[Callable], sink_opener: Optional[Callable],
                 seed: Callable[[], int], acks: Callable[[], dict], seed_acks: dict, dead_letters: dict,
                 restore_t: Optional[tuple] = None) -> None:
        self.plan, self.instance, self.restore_t = plan, instance, restore_t
        self.backend_factory, self.sink_opener = backend_factory, sink_opener
        self.seed, self.acks, self.seed_acks, self.dead_letters = seed, acks, seed_acks, dead_letters

    def backend(self, step: Any, fn: Callable, entries: bool) -> Any:
        if self.backend_factory is None:
            return None
        return self.backend_factory(step.name, fn, entries, state_keys(step, self.plan))


def state_keys(step: Any, plan: Plan) -> StateKeys:
    """How ``step``'s state keys are stored: under the key group of the key its elements were
    routed by, which is the state key itself, or its first item for entries ``(key, entry)``
    and windows ``(key, start, end)`` (sessions and interval joins keep one state per key)."""
    composite = step.state is MapState or (step.window is not None and not isinstance(step.window.assigner, Session))
    return StateKeys(plan.key_groups, first if composite else None)
