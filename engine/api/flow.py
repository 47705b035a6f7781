"""The public API: ``Flow`` and ``Stream``.

>>> from driftstream.engine.testing import MemorySource, MemorySink
>>> flow = Flow("wc")
>>> out = MemorySink("counts")
>>> def count(n, word):
...     n = (n or 0) + 1
...     return n, (word, n)
>>> (flow.source(MemorySource(["a b", "b"]), name="lines")
...      .flat_map(str.split, name="split")
...      .key_by(lambda w: w, name="by_word")
...      .stateful_map(count, name="count")
...      .sink(out))
>>> flow.run(runtime="simulator", seed=3).output("counts")
[('a', 1), ('b', 1), ('b', 2)]

Invalid pipelines fail here, at build time, with what to change:

>>> flow.source(MemorySource([1])).stateful_map(count)
Traceback (most recent call last):
...
driftstream.engine.model.errors.FlowError: step 'stateful_map': stateful_map needs a keyed stream; call .key_by(key_fn) right before .stateful_map(...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from driftstream.barriers.sink import Sink
from driftstream.ordering.entry_state import MapState

from driftstream.engine.connectors.source import Source
from driftstream.engine.model.errors import FlowError

if TYPE_CHECKING:  # type names in signatures; the runtimes are imported when a flow runs
    from driftstream.engine.api.handle import FlowHandle
    from driftstream.engine.model.plan import Plan
    from driftstream.engine.model.result import RunResult

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")

STATELESS = ("map", "flat_map", "filter")
STATEFUL = ("stateful_map", "stateful_flat_map")


@dataclass
class Step:
    """One operator of the flow graph; ``inputs`` are the ids of the steps feeding it."""

    id: int
    name: str
    kind: str
    inputs: list = field(default_factory=list)
    fn: Optional[Callable] = None
    source: Optional[Source] = None
    sink: Optional[Sink] = None
    #: stateful steps: None, the whole state a value (``fn(state, x) -> (state, out)``), or
    #: :class:`MapState`, a map of entries changed in place (``fn(entries, x) -> out``)
    state: Optional[type] = None


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise FlowError(f"{what} name {name!r} is invalid: use letters, digits, '_', '-' or '.' (it becomes part of actor names)")


class Flow:
    """A dataflow graph under construction. ``run`` executes it; ``plan`` shows how."""

    def __init__(self, name: str) -> None:
        _check_name("flow", name)
        self.name = name
        self.steps: list = []
        self._names: set = set()

    # -- building -------------------------------------------------------------------

    def source(self, source: Source, name: Optional[str] = None) -> "Stream":
        """Add an input. ``source`` is a :class:`~driftstream.engine.connectors.source.Source` (MemorySource, KafkaSource, ...)."""
        if not isinstance(source, Source):
            raise FlowError(f"flow.source() takes a Source (e.g. MemorySource([...])), not {type(source).__name__}")
        return Stream(self, self._add("source", name, [], source=source))

    def _add(self, kind: str, name: Optional[str], inputs: list, **kw: Any) -> Step:
        if name is None:
            name = kind if kind not in self._names else next(f"{kind}_{i}" for i in range(1, 10**6) if f"{kind}_{i}" not in self._names)
        _check_name("step", name)
        if name in self._names:
            raise FlowError(f"step name {name!r} is used twice in flow {self.name!r}: give each step a unique name=")
        fn = kw.get("fn")
        if kind not in ("source", "sink", "merge") and not callable(fn):
            raise FlowError(f"step {name!r}: {kind} needs a callable (a function or lambda), got {type(fn).__name__} {fn!r}")
        step = Step(len(self.steps), name, kind, list(inputs), **kw)
        self.steps.append(step)
        self._names.add(name)
        return step

    # -- running --------------------------------------------------------------------

    def validate(self) -> None:
        """Raise FlowError if the flow cannot run: no source, or no sink."""
        if not any(s.kind == "source" for s in self.steps):
            raise FlowError(f"flow {self.name!r} has no source: start with flow.source(MemorySource([...])) or another Source")
        if not any(s.kind == "sink" for s in self.steps):
            raise FlowError(f"flow {self.name!r} has no sink: end a stream with .sink(MemorySink('out')) or another Sink")

    def plan(self, parallelism: int = 1) -> "Plan":
        """Stages (fused operator chains), their steps and actor names.

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("p")
        >>> f.source(MemorySource([1]), name="src").map(abs, name="abs").key_by(str, name="k").sink(MemorySink("o"))
        >>> [(s.name, s.steps, s.actor_names) for s in f.plan(parallelism=1).stages]
        [('src', ['src', 'abs'], ['p/src/0']), ('k', ['k', 'o'], ['p/k/0'])]
        """
        from driftstream.engine.model.plan import compile_plan

        return compile_plan(self, parallelism)

    def run(
        self,
        parallelism: int = 1,
        runtime: str = "ray",
        seed: Optional[int] = None,
        address: Optional[str] = None,
        **options: Any,
    ) -> "RunResult":
        """Run bounded sources to the end and return the released output and metrics.

        ``runtime="ray"`` (default) runs one actor per stage instance, connecting to
        ``address`` or reusing the caller's Ray connection, else starting Ray locally.
        ``runtime="simulator"`` runs in this process with a scheduler seeded by ``seed``
        that delivers batches in adversarial orders.
        Options: ``batch_size`` (elements per source read), ``max_inflight`` (credit per
        source instance), ``chaos`` (test-only: max random delay in seconds per batch).
        Ray only: ``guarantee`` ("none" (default), "at-least-once", "at-most-once", "exactly-once"),
        ``snapshot_interval`` (seconds), ``snapshot_dir`` (a local path or a pyarrow.fs URI;
        default: a directory per flow under the temp dir), ``resume`` (start from the
        newest snapshot in ``snapshot_dir`` instead of from the beginning).
        """
        if runtime == "ray":
            from driftstream.engine.control.launch import run_on_ray

            return run_on_ray(self.plan(parallelism), address=address, seed=seed, **options)
        if runtime == "simulator":
            from driftstream.engine.model.config import RunConfig
            from driftstream.engine.runtime.simulator import run_simulated

            return run_simulated(self.plan(parallelism), RunConfig.from_options(seed=seed, **options))
        raise FlowError(f"unknown runtime {runtime!r}: use runtime='ray' or runtime='simulator'")


    def start(self, parallelism: int = 1, address: Optional[str] = None, **options: Any) -> "FlowHandle":
        """Start the flow on Ray in the background (for unbounded sources); returns a
        :class:`~driftstream.engine.api.handle.FlowHandle` with ``status()``, ``stop()`` and ``wait()``.

        Takes the options of :meth:`run`; with ``resume=True`` and the same ``snapshot_dir``
        it continues from the newest snapshot, also after the previous driver was killed.
        """
        from driftstream.engine.api.handle import start_on_ray

        return start_on_ray(self.plan(parallelism), address=address, **options)


class Stream:
    """The output of a step; each method adds a step and returns its output stream."""

    def __init__(self, flow: Flow, step: Step) -> None:
        self.flow = flow
        self.step = step

    def _then(self, kind: str, fn: Any, name: Optional[str]) -> "Stream":
        return Stream(self.flow, self.flow._add(kind, name, [self.step.id], fn=fn))

    def map(self, fn: Callable[[Any], Any], name: Optional[str] = None) -> "Stream":
        """One output per element: ``fn(x)``."""
        return self._then("map", fn, name)

    def flat_map(self, fn: Callable[[Any], Iterable], name: Optional[str] = None) -> "Stream":
        """Zero or more outputs per element: the items of ``fn(x)``."""
        return self._then("flat_map", fn, name)

    def filter(self, fn: Callable[[Any], bool], name: Optional[str] = None) -> "Stream":
        """Keep the elements for which ``fn(x)`` is true."""
        return self._then("filter", fn, name)

    def key_by(self, fn: Callable[[Any], Any], name: Optional[str] = None) -> "KeyedStream":
        """Shuffle by ``fn(x)`` (a str, bytes, number or tuple): equal keys meet in one instance."""
        s = self._then("key_by", fn, name)
        return KeyedStream(s.flow, s.step)

    def stateful_map(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, state: Optional[type] = None) -> "Stream":
        """Per-key state: ``fn(state, x) -> (new_state, output)``; state starts as None, output None emits nothing.

        ``fn`` must not mutate ``state`` (it may be re-applied after a late arrival): return a new state.

        With ``state=MapState`` the key's state is a map of entries that ``fn`` changes in
        place, ``fn(entries, x) -> output``: ``entries.get(e)``, ``.put(e, value)``,
        ``.remove(e)``, ``e in entries``, ``len(entries)``. Each costs O(1) whatever the
        map's size (a posting list, a session, a history), and snapshots write only the
        entries that changed::

            def count_pages(pages: MapState, visit):
                pages.put(visit["page"], visit["at"])
                return len(pages)
            visits.key_by(user).stateful_map(count_pages, state=MapState)
        """
        return self._stateful("stateful_map", fn, name, state)

    def stateful_flat_map(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, state: Optional[type] = None) -> "Stream":
        """Like stateful_map, but ``fn(state, x) -> (new_state, iterable_of_outputs)``
        (with ``state=MapState``: ``fn(entries, x) -> iterable_of_outputs``)."""
        return self._stateful("stateful_flat_map", fn, name, state)

    def _stateful(self, kind: str, fn: Callable, name: Optional[str], state: Optional[type]) -> "Stream":
        self._require_keyed(kind, name)
        if state not in (None, MapState):
            raise FlowError(f"step {name or kind!r}: state= takes MapState (from driftstream.engine) or None (the state a value), not {state!r}")
        return Stream(self.flow, self.flow._add(kind, name, [self.step.id], fn=fn, state=state))

    def merge(self, *others: "Stream", name: Optional[str] = None) -> "Stream":
        """The union of this stream and ``others`` (same flow)."""
        for o in others:
            if not isinstance(o, Stream) or o.flow is not self.flow:
                raise FlowError(f"merge: every input must be a Stream of flow {self.flow.name!r}")
        if not others:
            raise FlowError("merge needs at least one other stream: a.merge(b, ...)")
        step = self.flow._add("merge", name, [self.step.id] + [o.step.id for o in others])
        return Stream(self.flow, step)

    def sink(self, sink: Sink, name: Optional[str] = None) -> None:
        """Send the stream to ``sink``; its barrier releases elements in t order. The step is named after the sink."""
        if not isinstance(sink, Sink):
            raise FlowError(f"sink() takes a Sink (e.g. MemorySink('out')), not {type(sink).__name__}")
        self.flow._add("sink", name or sink.name, [self.step.id], sink=sink)

    def _require_keyed(self, kind: str, name: Optional[str]) -> None:
        if not isinstance(self, KeyedStream):
            label = name or kind
            raise FlowError(f"step {label!r}: {kind} needs a keyed stream; call .key_by(key_fn) right before .{kind}(...)")


class KeyedStream(Stream):
    """A stream right after ``key_by``: the only place stateful operators may follow."""

