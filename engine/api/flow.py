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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Unpack

from driftstream.engine.model.connectors import Sink, Source
from driftstream.ordering.entry_state import MapState
from driftstream.ordering.key_groups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from driftstream.ordering.windowed_state import interval_step
from driftstream.ordering.windows import IntervalJoinSpec, Late, Session, Sliding, WindowResult, WindowSpec

from driftstream.engine.api.aggregates import (
    count_step, fold_step, reduce_step, window_collect, window_count, window_counts, window_fold, window_list, window_reduce,
    window_value,
)
from driftstream.engine.api.joins import HOWS, join_collect, join_pairs, lookup_step
from driftstream.engine.model.config import RunOptions
from driftstream.engine.model.errors import ON_ERROR, FlowError, is_not_dead_letter
from driftstream.engine.model.steps import (
    DEAD_LETTERS, FILTER, FLAT_MAP, FLAT_MAP_BATCHES, INTERVAL_JOIN, KEY_BY, LOOKUP, MAP, MAP_BATCHES, MERGE, SINK, SOURCE,
    STATEFUL_FLAT_MAP, STATEFUL_MAP, WINDOW, WINDOW_JOIN, Step, StepKind,
)

if TYPE_CHECKING:  # type names in signatures; the runtimes are imported when a flow runs
    from driftstream.engine.api.handle import FlowHandle
    from driftstream.engine.model.plan import Plan
    from driftstream.engine.model.result import RunResult

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")  # fullmatch: no newline, no leading '.' or '-' (".", "..")

def _schema(schema: Any, step: str) -> Any:
    """``schema`` if it is None or a ``pyarrow.Schema``; else a FlowError that says what to give."""
    if schema is None:
        return None
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise FlowError(f"step {step!r}: schema= takes a pyarrow.Schema (e.g. pa.schema([('page_id', pa.int64()), "
                        f"('text', pa.string())])), not {type(schema).__name__}")
    return schema


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FlowError(f"{what} name {name!r} is invalid: use letters, digits, '_', '-' or '.', starting with a letter, "
                        "digit or '_' (it becomes part of actor names and snapshot paths)")


class Flow:
    """A dataflow graph under construction. ``run`` executes it; ``plan`` shows how."""

    def __init__(self, name: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> None:
        """``max_parallelism``: the most instances a keyed stage of this flow may ever run, and
        the number of key groups its state is stored in (see :mod:`driftstream.ordering.key_groups`).
        A snapshot restores at any parallelism up to it, and only into a flow with the same one."""
        _check_name("flow", name)
        try:
            check_max_parallelism(max_parallelism)
        except ValueError as exc:
            raise FlowError(f"flow {name!r}: {exc}") from None
        self.name = name
        self.max_parallelism = max_parallelism
        self.steps: list = []
        self._names: set = set()
        self._dead_letter_sink: Optional[Sink] = None

    # -- building -------------------------------------------------------------------

    def source(self, source: Source, name: Optional[str] = None) -> "Stream":
        """Add an input. ``source`` is a :class:`~driftstream.engine.model.connectors.Source` (MemorySource, KafkaSource, ...)."""
        if not isinstance(source, Source):
            raise FlowError(f"flow.source() takes a Source (e.g. MemorySource([...])), not {type(source).__name__}")
        step = self._add(SOURCE, name, [], source=source, on_error="dead-letter" if source.emits_dead_letters else "fail")
        if source.emits_dead_letters:
            source.step_name = step.name  # its dead letters name the step
        stream = Stream(self, step)
        stream.step = stream._diverting(step)
        return stream

    def _add(self, kind: StepKind, name: Optional[str], inputs: list, **kw: Any) -> Step:
        if name is None:
            label = kw.pop("label", None) or kind.name
            name = label if label not in self._names else next(f"{label}_{i}" for i in range(1, 10**6) if f"{label}_{i}" not in self._names)
        kw.pop("label", None)
        _check_name("step", name)
        if name in self._names:
            raise FlowError(f"step name {name!r} is used twice in flow {self.name!r}: give each step a unique name=")
        fn = kw.get("fn")
        if kind.takes_fn and not callable(fn):
            raise FlowError(f"step {name!r}: {kind.name} needs a callable (a function or lambda), got {type(fn).__name__} {fn!r}")
        step = Step(len(self.steps), name, kind, list(inputs), **kw)
        self.steps.append(step)
        self._names.add(name)
        return step

    def dead_letters(self, sink: Sink) -> "Flow":
        """Where the elements of steps with ``on_error="dead-letter"`` go, as
        :class:`~driftstream.engine.model.errors.DeadLetter` records (default for a flow
        with one KafkaSource: its dead-letter topic, ``<topic>.dlq``). Returns the flow.

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> flow = Flow("parse").dead_letters(MemorySink("dlq"))
        >>> flow.source(MemorySource(["1", "x", "3"])).map(int, on_error="dead-letter").sink(MemorySink("out"))
        >>> result = flow.run(runtime="simulator")
        >>> result.output("out"), [(d.step, d.element, d.error) for d in result.output("dlq")]
        ([1, 3], [('map', 'x', "ValueError: invalid literal for int() with base 10: 'x'")])
        """
        if not isinstance(sink, Sink):
            raise FlowError(f"dead_letters() takes a Sink (e.g. KafkaSink('events.dlq', ...)), not {type(sink).__name__}")
        self._dead_letter_sink = sink
        return self

    def steps_to_run(self) -> list:
        """The steps, then those that take dead letters to their sinks: per destination, a
        merge of the dead letters it takes (when more than one step sends them) and its sink
        step, named after the sink. The destination: the flow's dead-letter sink; without
        one, a Kafka source's dead-letter topic (``dlq_topic``) for that source's undecodable
        records, and for a step's failures the topic of the flow's one Kafka source."""
        diverted = [s for s in self.steps if s.kind.takes_dead_letters]
        if not diverted:
            return self.steps
        groups: dict = {}  # destination -> the dead_letters steps it takes
        for d in diverted:
            groups.setdefault(self._dead_letter_destination(d), []).append(d.id)
        steps = list(self.steps)
        for destination, ids in groups.items():
            sink = self._dead_letter_sink if destination is None else _kafka_dead_letter_sink(destination, len(groups) > 1, self.max_parallelism)
            for name in (f"{sink.name}.all", f"{sink.name}.by_partition", sink.name):
                if name in self._names:
                    raise FlowError(f"the step name {name!r} is taken by the flow's dead-letter sink: name your step otherwise")
            last = ids[0]
            if len(ids) > 1:
                steps.append(Step(len(steps), f"{sink.name}.all", MERGE, ids))
                last = len(steps) - 1
            route = sink.partition_key(self.max_parallelism)
            if route is not None:  # as Stream.sink: each part of the destination has one writer
                steps.append(Step(len(steps), f"{sink.name}.by_partition", KEY_BY, [last], fn=route))
                last = len(steps) - 1
            steps.append(Step(len(steps), sink.name, SINK, [last], sink=sink))
        return steps

    def _dead_letter_destination(self, diverted: Step) -> Optional[tuple]:
        """None (the flow's dead-letter sink), or the ``(topic, servers, security)`` of a
        Kafka source's dead-letter topic."""
        from driftstream.engine.connectors.kafka.source import KafkaSource

        if self._dead_letter_sink is not None:
            return None
        failing = self.steps[diverted.inputs[0]]
        sources = [failing.source] if failing.kind.is_source else [s.source for s in self.steps if s.kind.is_source]
        topics = {(s.dlq_topic, s.bootstrap_servers, s.security) for s in sources if isinstance(s, KafkaSource)}
        if len(topics) != 1:
            raise FlowError(f"step {failing.name!r} sends {'records it cannot decode' if failing.kind.is_source else 'its failures'} "
                            f"to dead letters, but flow {self.name!r} has no dead-letter sink "
                            f"({'several Kafka sources' if topics else 'no Kafka source'}): call flow.dead_letters(sink) "
                            "(e.g. FileSink('dlq') or KafkaSink('events.dlq', servers))")
        return topics.pop()

    # -- running --------------------------------------------------------------------

    def validate(self) -> None:
        """Raise FlowError if the flow cannot run: no source, or no sink."""
        if not any(s.kind.is_source for s in self.steps):
            raise FlowError(f"flow {self.name!r} has no source: start with flow.source(MemorySource([...])) or another Source")
        if not any(s.kind.is_sink for s in self.steps):
            raise FlowError(f"flow {self.name!r} has no sink: end a stream with .sink(MemorySink('out')) or another Sink")

    def plan(self, parallelism: int = 1, fuse: bool = True) -> "Plan":
        """Stages (fused operator chains), their steps and actor names. At parallelism 1 a
        ``key_by`` stays in its input's stage unless ``fuse=False`` (see :mod:`~driftstream.engine.model.plan`).

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> f = Flow("p")
        >>> f.source(MemorySource([1]), name="src").map(abs, name="abs").key_by(str, name="k").sink(MemorySink("o"))
        >>> [(s.name, s.steps, s.actor_names) for s in f.plan(parallelism=2).stages]
        [('src', ['src', 'abs'], ['p/src/0', 'p/src/1']), ('k', ['k', 'o'], ['p/k/0', 'p/k/1'])]
        >>> [(s.name, s.steps, s.actor_names) for s in f.plan(parallelism=1).stages]
        [('src', ['src', 'abs', 'k', 'o'], ['p/src/0'])]
        """
        from driftstream.engine.model.plan import compile_plan

        return compile_plan(self, parallelism, fuse=fuse)

    def run(self, parallelism: int = 1, runtime: str = "ray", *, address: Optional[str] = None,
            **options: Unpack[RunOptions]) -> "RunResult":
        """Run bounded sources to the end and return the released output and metrics.

        ``runtime="ray"`` (default) runs one actor per stage instance, connecting to
        ``address`` or reusing the caller's Ray connection, else starting Ray locally.
        ``runtime="simulator"`` runs in this process with a scheduler seeded by ``seed``
        that delivers batches in adversarial orders, and snapshots, recoveries and the
        guarantees as Ray does (in memory).

        ``options`` are keyword-only, the fields of
        :class:`~driftstream.engine.model.config.RunConfig` (typed as
        :class:`~driftstream.engine.model.config.RunOptions`), which documents each and holds
        its default; an unknown name fails with the closest one. The main ones:
        ``guarantee`` ("none" (default), "at-least-once", "at-most-once", "exactly-once"),
        ``snapshot_interval`` (seconds), ``snapshot_dir`` (a local path or a pyarrow.fs URI;
        default: the user's private data directory's ``snapshots/<flow name>``), ``resume``
        (continue from the newest snapshot in ``snapshot_dir``), ``fresh`` (discard them and
        start from the beginning; a start with neither over snapshots of the flow is
        refused), ``batch_size`` (elements per source read), ``max_inflight`` (credit per
        source instance), ``seed``, ``chaos`` (max random delay in seconds per batch).
        """
        if runtime == "ray":
            from driftstream.engine.control.launch import run_on_ray
            from driftstream.engine.model.config import refuse_on_ray

            plan = self.plan(parallelism, fuse=options.get("fuse", True))
            refuse_on_ray(options, plan)

            return run_on_ray(plan, address=address, **options)
        if runtime == "simulator":
            from driftstream.engine.control.resume import check_sources
            from driftstream.engine.model.config import RunConfig
            from driftstream.engine.runtime.simulator import run_simulated

            plan = self.plan(parallelism, fuse=options.get("fuse", True))
            check_sources(plan)  # as on Ray: a source that cannot be reached fails first, not a sink opened before it
            return run_simulated(plan, RunConfig.from_options(**options))
        raise FlowError(f"unknown runtime {runtime!r}: use runtime='ray' or runtime='simulator'")


    def start(self, parallelism: int = 1, *, address: Optional[str] = None, detached: bool = False,
              **options: Unpack[RunOptions]) -> "FlowHandle":
        """Start the flow on Ray in the background (for unbounded sources); returns a
        :class:`~driftstream.engine.api.handle.FlowHandle` with ``status()``, ``stop()`` and ``wait()``.

        Takes the options of :meth:`run`; with ``resume=True`` and the same ``snapshot_dir``
        it continues from the newest snapshot, also after the previous driver was killed.
        ``detached=True`` (with the ``address`` of a cluster): the flow runs on after this
        driver exits; :func:`~driftstream.engine.attach` reaches it by name.
        """
        from driftstream.engine.api.handle import start_on_ray
        from driftstream.engine.model.config import refuse_on_ray

        plan = self.plan(parallelism, fuse=options.get("fuse", True))
        refuse_on_ray(options, plan)
        return start_on_ray(plan, address=address, detached=detached, **options)


#: Partitions a dead-letter topic the flow creates gets (at most the flow's max_parallelism):
#: each sink instance writes its own, so a rescale up to this many needs no change to it.
DEAD_LETTER_PARTITIONS = 32


def _kafka_dead_letter_sink(destination: tuple, several: bool, max_parallelism: int) -> Sink:
    from driftstream.engine.connectors.kafka.dead_letter_sink import DeadLetterKafkaSink

    topic, servers, security = destination
    return DeadLetterKafkaSink(topic, servers, name=f"dead_letters.{topic}" if several else "dead_letters", security=security,
                               create_partitions=min(DEAD_LETTER_PARTITIONS, max_parallelism))


class Stream:
    """The output of a step; each method adds a step and returns its output stream."""

    def __init__(self, flow: Flow, step: Step) -> None:
        self.flow = flow
        self.step = step

    def _then(self, kind: StepKind, fn: Any, name: Optional[str], on_error: str = "fail", **kw: Any) -> "Stream":
        step = self.flow._add(kind, name, [self.step.id], fn=fn, on_error=_on_error(on_error, name or kind.name), **kw)
        return Stream(self.flow, self._diverting(step))

    def _diverting(self, step: Step) -> Step:
        """``step``, or with ``on_error="dead-letter"`` the step after it that passes all
        but its dead letters (these go to the flow's dead-letter sink)."""
        if step.on_error == "fail":
            return step
        self.flow._add(DEAD_LETTERS, f"{step.name}.dead_letters", [step.id])
        return self.flow._add(FILTER, f"{step.name}.ok", [step.id], fn=is_not_dead_letter)

    def map(self, fn: Callable[[Any], Any], name: Optional[str] = None, on_error: str = "fail", deterministic: bool = True) -> "Stream":
        """One output per element: ``fn(x)``.

        Every step that runs a function takes ``on_error``: ``"fail"`` (a ``StepError``
        stops the run) or ``"dead-letter"``: an element the function raises on leaves the
        stream there and goes to the flow's dead-letter sink (:meth:`Flow.dead_letters`) as a
        ``DeadLetter(step, element, t, error, traceback, truncated, element_size)`` (cut at
        64 KiB), counted in ``metrics.dead_letters``
        and ``status()``; the run goes on.

        Every stateless step (``map``, ``flat_map``, ``filter`` and the ``_batches`` forms)
        takes ``deterministic``: ``False`` declares that ``fn`` may give another output for the
        same element (time, randomness, a call to an outside service). Its outputs are then
        logged beside the snapshots and, after a failure, replayed instead of recomputed, so
        the output after a recovery goes on from what was released before it. It costs such a
        flow a log write before each batch is acknowledged (latency, not throughput).

        >>> import random
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> flow = Flow("noisy")
        >>> flow.source(MemorySource([1, 2])).map(lambda x: x + random.random(), deterministic=False).sink(MemorySink("out"))
        >>> print(flow.plan(1).describe().splitlines()[1])
          stage source: source -> map (logged) -> out
        """
        return self._then(MAP, fn, name, on_error, deterministic=_deterministic(deterministic, name or "map"))

    def flat_map(self, fn: Callable[[Any], Iterable], name: Optional[str] = None, on_error: str = "fail",
                 deterministic: bool = True) -> "Stream":
        """Zero or more outputs per element: the items of ``fn(x)`` (``deterministic``: see :meth:`map`)."""
        return self._then(FLAT_MAP, fn, name, on_error, deterministic=_deterministic(deterministic, name or "flat_map"))

    def map_batches(self, fn: Callable[[Any], Any], name: Optional[str] = None, on_error: str = "fail", schema: Any = None,
                    deterministic: bool = True) -> "Stream":
        """One output per element, computed over a batch of them in Arrow: ``fn`` takes a
        ``pyarrow.RecordBatch`` with a row per element and returns one with a row per row;
        output row i (a dict) is element i's output. A row's output must depend on that row
        alone (a replay batches elements differently).

        Elements are dicts, or with ``schema`` (a ``pyarrow.Schema``) also JSON documents as
        bytes, as ``KafkaSource(value_format="bytes")`` hands them out: a batch's are parsed
        together by Arrow's JSON reader into that schema. Its fields that are not nullable
        must be there; an element that does not parse, or lacks one, fails alone (with
        ``on_error="dead-letter"`` it becomes a dead letter and the others go on). A schema
        also fixes the types of dict rows, which Arrow otherwise infers per batch.

        >>> import pyarrow.compute as pc
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> flow = Flow("upper")
        >>> (flow.source(MemorySource([{"w": "a"}, {"w": "b"}]))
        ...  .map_batches(lambda b: b.set_column(0, "w", pc.utf8_upper(b["w"]))).sink(MemorySink("out")))
        >>> flow.run(runtime="simulator").output("out")
        [{'w': 'A'}, {'w': 'B'}]
        >>> import pyarrow as pa
        >>> flow = Flow("parsed")
        >>> (flow.source(MemorySource([b'{"w": "a", "n": 1}', b'{"w": "b"}']))
        ...  .map_batches(lambda b: b, schema=pa.schema([("w", pa.string()), ("n", pa.int64())])).sink(MemorySink("out")))
        >>> flow.run(runtime="simulator").output("out")
        [{'w': 'a', 'n': 1}, {'w': 'b', 'n': None}]
        """
        return self._then(MAP_BATCHES, fn, name, on_error, schema=_schema(schema, name or "map_batches"),
                          deterministic=_deterministic(deterministic, name or "map_batches"))

    def flat_map_batches(self, fn: Callable[[Any], tuple], name: Optional[str] = None, on_error: str = "fail", schema: Any = None,
                         deterministic: bool = True) -> "Stream":
        """Zero or more outputs per element, computed over a batch in Arrow: ``fn(batch)``
        returns ``(record batch, parents)``, where output row j comes from input row
        ``parents[j]`` (``pyarrow.compute.list_parent_indices`` of a split gives them).
        ``schema``: as :meth:`map_batches`'.

        >>> import pyarrow as pa, pyarrow.compute as pc
        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> def words(batch):
        ...     split = pc.split_pattern_regex(batch["text"], r"\\s+")  # pyarrow 26's utf8_split_whitespace mis-splits slices
        ...     return pa.record_batch({"word": pc.list_flatten(split)}), pc.list_parent_indices(split)
        >>> flow = Flow("words")
        >>> flow.source(MemorySource([{"text": "to be"}, {"text": "or"}])).flat_map_batches(words).sink(MemorySink("out"))
        >>> flow.run(runtime="simulator").output("out")
        [{'word': 'to'}, {'word': 'be'}, {'word': 'or'}]
        """
        return self._then(FLAT_MAP_BATCHES, fn, name, on_error, schema=_schema(schema, name or "flat_map_batches"),
                          deterministic=_deterministic(deterministic, name or "flat_map_batches"))

    def filter(self, fn: Callable[[Any], bool], name: Optional[str] = None, on_error: str = "fail", deterministic: bool = True) -> "Stream":
        """Keep the elements for which ``fn(x)`` is true (``deterministic``: see :meth:`map`)."""
        return self._then(FILTER, fn, name, on_error, deterministic=_deterministic(deterministic, name or "filter"))

    def key_by(self, fn: Callable[[Any], Any], name: Optional[str] = None, on_error: str = "fail") -> "KeyedStream":
        """Shuffle by ``fn(x)`` (a str, bytes, number or tuple): equal keys meet in one instance."""
        s = self._then(KEY_BY, fn, name, on_error)
        return KeyedStream(s.flow, s.step, key_fn=fn)

    def stateful_map(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, state: Optional[type] = None,
                     on_error: str = "fail", deterministic: bool = True) -> "Stream":
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

        With ``on_error="dead-letter"``, an element ``fn`` raises on leaves as a dead letter
        and the key's state is as if it had not come.

        ``fn`` must be deterministic (``deterministic=False`` is refused): a late element
        re-applies it to the elements after it. Draw randomness in a
        ``.map(fn, deterministic=False)`` before the ``key_by``, whose outputs are logged.
        """
        _stateful_deterministic(deterministic, name or "stateful_map")
        return self._stateful(STATEFUL_MAP, fn, name, state, on_error=on_error)

    def stateful_flat_map(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, state: Optional[type] = None,
                          on_error: str = "fail", deterministic: bool = True) -> "Stream":
        """Like stateful_map, but ``fn(state, x) -> (new_state, iterable_of_outputs)``
        (with ``state=MapState``: ``fn(entries, x) -> iterable_of_outputs``)."""
        _stateful_deterministic(deterministic, name or "stateful_flat_map")
        return self._stateful(STATEFUL_FLAT_MAP, fn, name, state, on_error=on_error)

    def _stateful(self, kind: StepKind, fn: Callable, name: Optional[str], state: Optional[type], label: Optional[str] = None,
                  on_error: str = "fail") -> "Stream":
        """``label``: what a step without a name is named after (default: ``kind``)."""
        self._require_keyed(label or kind.name, name)
        if state not in (None, MapState):
            raise FlowError(f"step {name or kind.name!r}: state= takes MapState (from driftstream.engine) or None (the state a value), not {state!r}")
        return self._then(kind, fn, name, on_error, state=state, label=label)

    def merge(self, *others: "Stream", name: Optional[str] = None) -> "Stream":
        """The union of this stream and ``others`` (same flow)."""
        for o in others:
            if not isinstance(o, Stream) or o.flow is not self.flow:
                raise FlowError(f"merge: every input must be a Stream of flow {self.flow.name!r}")
        if not others:
            raise FlowError("merge needs at least one other stream: a.merge(b, ...)")
        step = self.flow._add(MERGE, name, [self.step.id] + [o.step.id for o in others])
        return Stream(self.flow, step)

    def sink(self, sink: Sink, name: Optional[str] = None) -> None:
        """Send the stream to ``sink``; its barrier releases elements in t order. The step is named after the sink."""
        if not isinstance(sink, Sink):
            raise FlowError(f"sink() takes a Sink (e.g. MemorySink('out')), not {type(sink).__name__}")
        name = name or sink.name
        step = self.step
        route = sink.partition_key(self.flow.max_parallelism)
        if route is not None:  # a shuffle, so that each part of the destination has one writer (a keyed KafkaSink)
            _check_name("step", name)
            if name in self.flow._names:
                raise FlowError(f"step name {name!r} is used twice in flow {self.flow.name!r}: give each step a unique name=")
            step = self.flow._add(KEY_BY, f"{name}.by_partition", [step.id], fn=route)
        self.flow._add(SINK, name, [step.id], sink=sink)

    def fold(self, init: Any, fn: Callable[[Any, Any], Any], name: Optional[str] = None, on_error: str = "fail") -> "Stream":
        """Keyed streams only (:meth:`KeyedStream.fold`)."""
        self._require_keyed("fold", name)

    def reduce(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, on_error: str = "fail") -> "Stream":
        """Keyed streams only (:meth:`KeyedStream.reduce`)."""
        self._require_keyed("reduce", name)

    def count(self, name: Optional[str] = None) -> "Stream":
        """Keyed streams only (:meth:`KeyedStream.count`)."""
        self._require_keyed("count", name)

    def _require_keyed(self, kind: str, name: Optional[str]) -> None:
        if not isinstance(self, KeyedStream):
            label = name or kind
            raise FlowError(f"step {label!r}: {kind} needs a keyed stream; call .key_by(key_fn) right before .{kind}(...)")


class KeyedStream(Stream):
    """A stream right after ``key_by``: the only place stateful operators may follow."""

    def __init__(self, flow: Flow, step: Step, key_fn: Callable[[Any], Any]) -> None:
        super().__init__(flow, step)
        self.key_fn = key_fn

    def fold(self, init: Any, fn: Callable[[Any, Any], Any], name: Optional[str] = None, on_error: str = "fail") -> Stream:
        """A running aggregate per key, one output per element: ``(key, aggregate)`` where the
        aggregate is ``fn(aggregate so far, x)``, starting from ``init``. ``fn`` must return a new
        value, not change the one it is given.

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> flow = Flow("totals")
        >>> (flow.source(MemorySource([("a", 1), ("b", 5), ("a", 2)])).key_by(lambda kv: kv[0])
        ...      .fold(0, lambda total, kv: total + kv[1]).sink(MemorySink("out")))
        >>> flow.run(runtime="simulator").output("out")
        [('a', 1), ('b', 5), ('a', 3)]
        """
        return self._stateful(STATEFUL_MAP, fold_step(init, fn, self.key_fn), name, None, label="fold", on_error=on_error)

    def reduce(self, fn: Callable[[Any, Any], Any], name: Optional[str] = None, on_error: str = "fail") -> Stream:
        """Like :meth:`fold`, the first element of a key being its first aggregate:
        ``(key, fn(aggregate so far, x))``, e.g. ``.reduce(max)``."""
        return self._stateful(STATEFUL_MAP, reduce_step(fn, self.key_fn), name, None, label="reduce", on_error=on_error)

    def count(self, name: Optional[str] = None) -> Stream:
        """``(key, elements of the key so far)`` per element."""
        return self._stateful(STATEFUL_MAP, count_step(self.key_fn), name, None, label="count")

    def window(self, assigner: Any, *, timestamp: Optional[Callable[[Any], float]] = None,
               allowed_lateness: float = 0.0, name: Optional[str] = None, on_error: str = "fail") -> "WindowedStream":
        """Event-time windows per key (``Tumbling(size)``, ``Sliding(size, slide)``,
        ``Session(gap)``, from :mod:`driftstream.engine.windows`); aggregate them with ``.reduce``, ``.fold``,
        ``.count`` or ``.collect``, which emit one ``WindowResult(key, start, end, value)`` per
        key and window when it closes: once the source time passes ``end + allowed_lateness``.

        ``timestamp(x)``: an element's event time in seconds (default: its source time, the
        Kafka record timestamp). An element whose source time has passed the close of a
        window it belongs to is late for it: counted (``metrics.late_elements``) and sent to
        ``.late(sink)`` when one is given. ``on_error="dead-letter"``: an element whose
        ``timestamp`` raises joins no window and goes to the flow's dead-letter sink (see
        :meth:`Stream.map`); the aggregate's own function fails the run when it raises, so
        check elements in a step before the window (``.map(check, on_error="dead-letter")``).

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> from driftstream.engine.windows import Tumbling
        >>> clicks = [("home", 0.5), ("home", 1.2), ("about", 1.7), ("home", 2.1)]
        >>> flow = Flow("clicks")
        >>> (flow.source(MemorySource(clicks)).key_by(lambda c: c[0])
        ...      .window(Tumbling(1), timestamp=lambda c: c[1]).count().sink(MemorySink("out")))
        >>> [(r.key, r.start, r.value) for r in flow.run(runtime="simulator").output("out")]
        [('home', 0.0, 1), ('home', 1.0, 1), ('about', 1.0, 1), ('home', 2.0, 1)]
        """
        if not isinstance(assigner, (Sliding, Session)):
            raise FlowError(f"window: the assigner is Tumbling(size), Sliding(size, slide) or Session(gap) from driftstream.engine.windows, not {assigner!r}")
        if timestamp is not None and not callable(timestamp):
            raise FlowError(f"window: timestamp= takes a function element -> event time in seconds, not {timestamp!r}")
        if isinstance(allowed_lateness, bool) or not isinstance(allowed_lateness, (int, float)) or allowed_lateness < 0:
            raise FlowError(f"window: allowed_lateness is seconds >= 0, not {allowed_lateness!r}")
        on_error = _on_error(on_error, name or "window")
        if on_error == "dead-letter" and timestamp is None:
            raise FlowError("window: on_error='dead-letter' diverts the elements whose timestamp= function raises, and no "
                            "timestamp= is given; to divert elements the aggregate would fail on, check them in a step "
                            "before the window: .map(check, on_error='dead-letter')")
        return WindowedStream(self, assigner, timestamp, float(allowed_lateness), name, on_error)

    def lookup(self, table: "KeyedStream", *, name: Optional[str] = None) -> Stream:
        """A temporal (stream-table) join: ``table`` is a keyed stream of updates; each element
        leaves as ``(element, value)``, ``value`` the table's latest update for its key *before
        the element in t order* (None if none). Elsewhere this join depends on which side a
        machine happened to process first; here a late update re-applies the elements after it.

        >>> from driftstream.engine.testing import MemorySource, MemorySink
        >>> flow = Flow("enrich")
        >>> events = flow.source(MemorySource([(1, "Ada"), (1, "order a"), (1, "Bob"), (1, "order b")]))
        >>> orders = events.filter(lambda e: e[1].startswith("order")).key_by(lambda e: e[0])
        >>> names = events.filter(lambda e: not e[1].startswith("order")).key_by(lambda e: e[0])
        >>> orders.lookup(names).sink(MemorySink("out"))
        >>> [(o[1], n[1]) for o, n in flow.run(runtime="simulator").output("out")]
        [('order a', 'Ada'), ('order b', 'Bob')]
        """
        self._check_other("lookup", table)
        return Stream(self.flow, self.flow._add(LOOKUP, name, [self.step.id, table.step.id], fn=lookup_step))

    def join(self, other: "KeyedStream", *, window: Any = None, interval: Any = None, how: str = "inner",
             name: Optional[str] = None) -> Stream:
        """A keyed stream-stream join of this stream (left) and ``other`` (right); event time is
        the source time (a Kafka record's timestamp).

        ``window=Tumbling(...)`` or ``Sliding(...)``: when a window closes it emits ``(key, left,
        right)`` for each pair of its elements, in t order; ``how="left"`` adds ``(key, left,
        None)`` for a left without a right in its window, ``"outer"`` also ``(key, None,
        right)``. Elements later than their window are counted and go to ``.late(sink)``.

        ``interval=(lower, upper)`` (seconds, Flink's interval join): ``(key, left, right)`` for
        each pair with ``left.time + lower <= right.time <= left.time + upper``, as soon as the
        later of the two is applied (at its t); ``how="left"`` / ``"outer"`` emit the unmatched
        ones once no later element can match them.
        """
        self._check_other("join", other)
        if how not in HOWS:
            raise FlowError(f"join: how= is one of {', '.join(map(repr, HOWS))}, not {how!r}")
        if (window is None) == (interval is None):
            raise FlowError("join: give either window=Tumbling(size) (pairs within one window) or interval=(lower, upper) (seconds)")
        if interval is not None:
            spec = _interval(interval, how)
            fn = interval_step(spec.lower_ms, spec.upper_ms)
            return Stream(self.flow, self.flow._add(INTERVAL_JOIN, name, [self.step.id, other.step.id], fn=fn, interval=spec, label="join"))
        if not isinstance(window, Sliding):
            raise FlowError(f"join: window= takes Tumbling(size) or Sliding(size, slide) from driftstream.engine.windows, not {window!r}")
        spec = WindowSpec(window, join_collect, _no_result, pairs=join_pairs(how))
        step = self.flow._add(WINDOW_JOIN, name, [self.step.id, other.step.id], fn=join_collect, window=spec, label="join")
        results = self.flow._add(FILTER, f"{step.name}.results", [step.id], fn=_is_not_late)
        return WindowOutput(self.flow, results, step)

    def _check_other(self, what: str, other: Any) -> None:
        if not isinstance(other, KeyedStream) or other.flow is not self.flow:
            raise FlowError(f"{what}: the other side is a keyed stream of flow {self.flow.name!r} (call .key_by(key_fn) on it)")
        if other.step is self.step:
            raise FlowError(f"{what}: a stream cannot be joined with itself; key the other side with a key_by of its own")


class WindowedStream:
    """A keyed stream cut into windows: choose the aggregate (each returns a stream of
    :class:`WindowResult`)."""

    def __init__(self, keyed: KeyedStream, assigner: Any, timestamp: Optional[Callable], allowed_lateness: float,
                 name: Optional[str], on_error: str = "fail") -> None:
        self.keyed, self.assigner, self.timestamp, self.allowed_lateness, self.name = keyed, assigner, timestamp, allowed_lateness, name
        self.on_error = on_error

    def reduce(self, fn: Callable[[Any, Any], Any]) -> "WindowOutput":
        """The window's first element, then ``fn(aggregate so far, x)`` for each next one in t order."""
        return self._aggregate(window_reduce(fn), window_value)

    def fold(self, init: Any, fn: Callable[[Any, Any], Any]) -> "WindowOutput":
        """``fn(aggregate so far, x)`` from ``init``, in t order (``fn`` returns a new value)."""
        return self._aggregate(window_fold(init, fn), window_value)

    def count(self) -> "WindowOutput":
        """How many elements the window holds."""
        return self._aggregate(window_count, window_value, combine=window_counts)

    def collect(self) -> "WindowOutput":
        """The window's elements, a list in t order."""
        return self._aggregate(window_collect(), window_list)

    def _aggregate(self, step_fn: Callable, result: Callable, combine: Optional[Callable] = None) -> "WindowOutput":
        keyed, flow = self.keyed, self.keyed.flow
        spec = WindowSpec(self.assigner, step_fn, result, self.timestamp, self.allowed_lateness, combine=combine)
        window = flow._add(WINDOW, self.name, [keyed.step.id], fn=step_fn, window=spec, on_error=self.on_error)
        if self.on_error == "dead-letter":  # the results filter below passes no dead letter
            flow._add(DEAD_LETTERS, f"{window.name}.dead_letters", [window.id])
        results = flow._add(FILTER, f"{window.name}.results", [window.id], fn=_is_result)
        return WindowOutput(flow, results, window)


class WindowOutput(Stream):
    """The results of a windowed aggregation; :meth:`late` adds a sink for late elements."""

    def __init__(self, flow: Flow, step: Step, window: Step) -> None:
        super().__init__(flow, step)
        self.window = window

    def late(self, sink: Sink, name: Optional[str] = None) -> "WindowOutput":
        """Send the elements that reached a window after it closed, as ``Late(key, element,
        event_time)``, to ``sink``; returns this stream of results."""
        late = self.flow._add(FILTER, f"{self.window.name}.late", [self.window.id], fn=_is_late)
        Stream(self.flow, late).sink(sink, name)
        return self


def _deterministic(flag: Any, step: str) -> bool:
    if not isinstance(flag, bool):
        raise FlowError(f"step {step!r}: deterministic= is True or False, not {flag!r}")
    return flag


def _stateful_deterministic(flag: Any, step: str) -> None:
    """A stateful step's function must be deterministic: FlowError saying where randomness goes."""
    if _deterministic(flag, step):
        return
    raise FlowError(f"step {step!r}: a stateful step cannot be deterministic=False: its state re-applies the function "
                    "when an element arrives late, and a different result then cannot be repaired; draw the randomness "
                    "(time, random, outside calls) in a .map(fn, deterministic=False) before the key_by, whose outputs are "
                    "logged and replayed, and keep the stateful function deterministic")


def _on_error(policy: Any, step: str) -> str:
    if policy not in ON_ERROR:
        raise FlowError(f"step {step!r}: on_error= is {' or '.join(map(repr, ON_ERROR))}, not {policy!r}")
    return policy


def _is_result(x: Any) -> bool:
    return type(x) is WindowResult


def _is_late(x: Any) -> bool:
    return type(x) is Late


def _is_not_late(x: Any) -> bool:
    return type(x) is not Late


def _interval(interval: Any, how: str) -> IntervalJoinSpec:
    try:
        lower, upper = interval
        lower_ms, upper_ms = round(lower * 1000), round(upper * 1000)
    except (TypeError, ValueError):
        raise FlowError(f"join: interval= is (lower, upper) in seconds, e.g. (-5, 5), not {interval!r}") from None
    if lower_ms > upper_ms:
        raise FlowError(f"join: interval=(lower, upper) needs lower <= upper, not {interval!r}")
    return IntervalJoinSpec(lower_ms, upper_ms, how)


def _no_result(state: Any) -> None:
    """A join's windows emit pairs (``WindowSpec.pairs``), not one result."""
