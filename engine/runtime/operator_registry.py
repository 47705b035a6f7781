"""One registry: the step kind of a plan step -> how its operator is built, with its state.

The operators' classes live in :mod:`.operators` (per element) and :mod:`.arrow_operators`
(per Arrow batch); this module imports both, so neither imports the other back. Adding a
step kind: its :class:`~driftstream.engine.model.steps.StepKind` in ``model/steps.py``, its
``Stream`` method in ``api/flow.py``, its operator class, and its builder here.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySink, MemorySource
>>> flow = Flow("reg"); flow.source(MemorySource([1])).map(abs).sink(MemorySink("o"))
>>> plan = flow.plan(1)
>>> ctx = StepContext(plan, 0, None, None, lambda: 7, lambda: {}, {}, {})
>>> [type(operator_for(step, ctx)).__name__ for step in plan.steps]
['Passthrough', 'Map', 'SinkStep']

Costs: building is once per step and instance; nothing here runs per element.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from driftstream.barriers.barrier import Barrier
from driftstream.ordering.entry_state import EntryKeyedState, MapState
from driftstream.ordering.keyed_state import DriftingKeyedState
from driftstream.ordering.paned_windows import PanedWindowState, paned
from driftstream.ordering.windowed_state import IntervalJoinState, SessionState, WindowedState, step_function
from driftstream.ordering.windows import Session
from driftstream.snapshots.entry_cache import CachedEntries
from driftstream.snapshots.output_log import OutputLog

from driftstream.engine.model import steps as kinds
from driftstream.engine.model.errors import dead_letter
from driftstream.engine.model.steps import Step
from driftstream.engine.runtime.arrow_operators import FlatMapBatches, MapBatches
from driftstream.engine.runtime.logged_step import LoggedStep
from driftstream.engine.runtime.operators import (
    DeadLettering, DeadLetterSplit, Filter, FlatMap, KeyBy, Keyed, Lookup, Map, Operator, Passthrough, SinkStep, StepContext, Timed,
)

#: how a step's operator is built from the step and its stage instance's context
Builder = Callable[[Step, StepContext], Operator]


def _divert(step: Step) -> Optional[Callable]:
    return functools.partial(dead_letter, step.name) if step.on_error == "dead-letter" else None


def _keyed(cls: type) -> Builder:
    """The builder of a ``cls`` operator over keyed state applied element by element."""

    def build(step: Step, ctx: StepContext) -> Operator:
        entries = step.state is MapState
        backend = ctx.backend(step, step.fn, entries)
        return cls(step.name, keyed_state(step, CachedEntries(backend) if entries and backend is not None else backend))

    return build


def keyed_state(step: Step, backend: Any) -> Any:
    """The state of keyed step ``step`` (``stateful_map``, ``stateful_flat_map``, lookup) over
    ``backend`` (an entry state's: an ``EntryBackend``; None: in memory); the instance's and,
    under ``verify="reexecute:N"``, the verifier's (verifier_actor.py)."""
    if step.state is MapState:
        return EntryKeyedState(step.fn, flat=step.kind.flat, backend=backend, on_error=_divert(step))
    return DriftingKeyedState(step.fn, flat=step.kind.flat, backend=backend, on_error=_divert(step))


def _window(step: Step, ctx: StepContext) -> Operator:
    """A window or window join: its windows' state, in the form its windows call for."""
    spec = step.window
    backend = ctx.backend(step, step_function(spec), False)
    form = SessionState if isinstance(spec.assigner, Session) else PanedWindowState if paned(spec) else WindowedState
    return _restored(step, ctx, form(spec, backend, seed=ctx.seed(), on_error=_divert(step)))


def _interval_join(step: Step, ctx: StepContext) -> Operator:
    iv = step.interval
    state = IntervalJoinState(iv.lower_ms, iv.upper_ms, iv.how, ctx.backend(step, step.fn, False), seed=ctx.seed())
    return _restored(step, ctx, state)


def _restored(step: Step, ctx: StepContext, state: Any) -> Operator:
    # Windows restored from a snapshot hold the watermark again at their close times: the
    # runtime hands these XORs to the acker before any source starts.
    state.restore_timers(ctx.seed_acks, ctx.restore_t)
    return Timed(step.name, state, ctx.acks)


def _stateless(cls: type, *fields: str) -> Builder:
    """The builder of ``cls(name, fn, *the step's fields)``, wrapped for dead letters if it diverts
    them, and behind its output log if it is not deterministic."""

    def build(step: Step, ctx: StepContext) -> Operator:
        op = cls(step.name, step.fn, *(getattr(step, f) for f in fields))
        op = DeadLettering(op) if step.on_error == "dead-letter" else op
        # deterministic=False: its outputs per input are logged and replayed (see logged_step.py)
        return op if step.deterministic else LoggedStep(op, OutputLog(), step.kind.flat)

    return build


def _passthrough(step: Step, ctx: StepContext) -> Operator:
    return Passthrough(step.name)


def _key_by(step: Step, ctx: StepContext) -> Operator:
    """Entered by a keyed channel, which routes and computes the key: a passthrough. In its
    input's stage (a fused plan) it computes the key itself."""
    if not ctx.plan.fused_key_by(step.id):
        return Passthrough(step.name)
    return KeyBy(step.name, step.fn, step.on_error == "dead-letter")


def _sink(step: Step, ctx: StepContext) -> Operator:
    sink = ctx.sink_opener(step.id, ctx.instance) if ctx.sink_opener else step.sink.open(ctx.instance, ctx.plan.parallelism)
    return SinkStep(step.name, Barrier(), sink)


def _dead_letters(step: Step, ctx: StepContext) -> Operator:
    return DeadLetterSplit(step.name, ctx.plan.steps[step.inputs[0]].name, ctx.dead_letters)


#: step kind -> how its operator is built
BUILDERS: dict = {
    kinds.SOURCE: _passthrough,
    kinds.KEY_BY: _key_by,
    kinds.MERGE: _passthrough,
    kinds.MAP: _stateless(Map),
    kinds.FLAT_MAP: _stateless(FlatMap),
    kinds.FILTER: _stateless(Filter),
    kinds.MAP_BATCHES: _stateless(MapBatches, "schema"),
    kinds.FLAT_MAP_BATCHES: _stateless(FlatMapBatches, "schema"),
    kinds.STATEFUL_MAP: _keyed(Keyed),
    kinds.STATEFUL_FLAT_MAP: _keyed(Keyed),
    kinds.LOOKUP: _keyed(Lookup),
    kinds.WINDOW: _window,
    kinds.WINDOW_JOIN: _window,
    kinds.INTERVAL_JOIN: _interval_join,
    kinds.DEAD_LETTERS: _dead_letters,
    kinds.SINK: _sink,
}


def operator_for(step: Step, ctx: StepContext) -> Operator:
    """The operator of plan step ``step``, with its state (restored through ``ctx``'s backend)."""
    build = BUILDERS.get(step.kind)
    if build is None:
        raise AssertionError(f"step {step.name!r}: no operator for kind {step.kind!r}; add its builder to BUILDERS")
    return build(step, ctx)

