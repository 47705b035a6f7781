"""Steps and their kinds: one :class:`StepKind` object per kind of step, one :class:`Step`
per operator of a flow graph.

A kind says, once, what every room needs to know about its steps: the plan (does a step
start a stage, shuffle, tag its inputs), the API (does it take a function), the snapshots
(does it keep keyed state) and the runtime (does it close state on timers). Code asks a
kind these questions (``step.kind.stateful``), never compares its name; the name is for
display and error messages. The runtime builds each kind's operator through one registry
(:mod:`driftstream.engine.runtime.operator_registry`).

>>> STATEFUL_MAP.stateful, STATEFUL_MAP.timed, WINDOW.timed, KEY_BY.shuffles
(True, False, True, True)
>>> [k.name for k in KINDS.values() if k.tagged_inputs]
['merge', 'lookup', 'window_join', 'interval_join']
>>> import pickle; pickle.loads(pickle.dumps(SINK)) is SINK    # a plan sent to an actor keeps its kinds
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from driftstream.ordering.windows import IntervalJoinSpec, WindowSpec

from driftstream.engine.model.connectors import Sink, Source


@dataclass(frozen=True, eq=False)
class StepKind:
    """What steps of one kind are, as flags; one object per kind (compare with ``is``)."""

    name: str
    #: the step calls a user's (or the engine's) function, which the API requires
    takes_fn: bool = True
    #: the flow's input: starts a stage, reads a Source
    is_source: bool = False
    #: the flow's output: writes a Sink, nothing follows it
    is_sink: bool = False
    #: a ``key_by``: its input reaches it through a keyed channel, and it starts a stage
    shuffles: bool = False
    #: a union of inputs: in its inputs' stage if they share one, else a stage of its own
    merges: bool = False
    #: the dead letters of the step before it, bound for a dead-letter sink
    takes_dead_letters: bool = False
    #: its inputs are told apart by a tag appended to each element's child ids (the input's
    #: position): a merge (one element may reach it by two branches with equal Metas), and
    #: the joins, whose state needs to know each element's side
    tagged_inputs: bool = False
    #: keeps keyed state: what snapshots hold, by step name
    stateful: bool = False
    #: its state closes on timers, which hold the watermark (windows, joins over time)
    timed: bool = False
    #: an element's outputs take child ids (a flat map's several outputs)
    flat: bool = False

    def __repr__(self) -> str:
        return f"<step kind {self.name}>"

    def __reduce__(self) -> tuple:
        # Unpickled as the same object (a plan travels to every actor), so ``is`` holds there too.
        return (kind_named, (self.name,))


SOURCE = StepKind("source", takes_fn=False, is_source=True)
KEY_BY = StepKind("key_by", shuffles=True)
MERGE = StepKind("merge", takes_fn=False, merges=True, tagged_inputs=True)
MAP = StepKind("map")
FLAT_MAP = StepKind("flat_map", flat=True)
FILTER = StepKind("filter")
MAP_BATCHES = StepKind("map_batches")
FLAT_MAP_BATCHES = StepKind("flat_map_batches", flat=True)
STATEFUL_MAP = StepKind("stateful_map", stateful=True)
STATEFUL_FLAT_MAP = StepKind("stateful_flat_map", stateful=True, flat=True)
LOOKUP = StepKind("lookup", stateful=True, tagged_inputs=True)
WINDOW = StepKind("window", stateful=True, timed=True)
WINDOW_JOIN = StepKind("window_join", stateful=True, timed=True, tagged_inputs=True)
INTERVAL_JOIN = StepKind("interval_join", stateful=True, timed=True, tagged_inputs=True)
DEAD_LETTERS = StepKind("dead_letters", takes_fn=False, takes_dead_letters=True)
SINK = StepKind("sink", takes_fn=False, is_sink=True)

#: every kind, by name
KINDS: dict = {k.name: k for k in (SOURCE, KEY_BY, MERGE, MAP, FLAT_MAP, FILTER, MAP_BATCHES, FLAT_MAP_BATCHES, STATEFUL_MAP,
                                   STATEFUL_FLAT_MAP, LOOKUP, WINDOW, WINDOW_JOIN, INTERVAL_JOIN, DEAD_LETTERS, SINK)}


def kind_named(name: str) -> StepKind:
    """The kind called ``name`` (KeyError names the kinds there are)."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"no step kind {name!r}; the kinds: {', '.join(KINDS)}") from None


@dataclass
class Step:
    """One operator of the flow graph; ``inputs`` are the ids of the steps feeding it."""

    id: int
    name: str
    kind: StepKind
    inputs: list = field(default_factory=list)
    fn: Optional[Callable] = None
    source: Optional[Source] = None
    sink: Optional[Sink] = None
    #: stateful steps: None, the whole state a value (``fn(state, x) -> (state, out)``), or
    #: :class:`MapState`, a map of entries changed in place (``fn(entries, x) -> out``)
    state: Optional[type] = None
    #: window steps: the windows, the aggregation and the event time
    window: Optional[WindowSpec] = None
    #: interval joins: the interval and which unmatched elements leave
    interval: Optional[IntervalJoinSpec] = None
    #: what an element the step's function raises on does: "fail" the run, or leave as a
    #: DeadLetter for the flow's dead-letter sink ("dead-letter")
    on_error: str = "fail"
    #: batch steps: the ``pyarrow.Schema`` of their rows (elements that are JSON bytes are
    #: parsed with it, in Arrow), or None (dict elements, types inferred per batch)
    schema: Any = None
    #: stateless steps: False if the function may give another output for the same input
    #: (time, randomness, outside calls); its outputs are then logged and replayed, never
    #: recomputed, after a failure (see engine/runtime/logged_step.py)
    deterministic: bool = True
