"""A sequential reference: apply a flow to its whole input one element at a time in t order.

No batching, no parallelism, no late arrivals: the output every runtime must match. It
borrows from the engine only the flow's declared steps, the user's functions and the
element types; the wiring, window arithmetic, the key order of simultaneous results and
dead letters are written here again from their documented meaning.
"""

from __future__ import annotations

import math
import struct
import traceback
import zlib

from driftstream.engine.api.flow import Flow
from driftstream.engine.model import steps as K
from driftstream.engine.model.errors import DeadLetter
from driftstream.engine import MapState
from driftstream.engine.testing import MemorySource
from driftstream.ordering.meta import TOP, Meta
from driftstream.ordering.windows import Late, Session, WindowResult

#: Steps that tell their inputs apart: an element entering input ``i`` gets child id ``i``.
TAGGED = (K.MERGE, K.LOOKUP, K.WINDOW_JOIN, K.INTERVAL_JOIN)


def reference_outputs(flow: Flow) -> dict:
    """``{sink name: [payload, ...]}`` in t order, for flows over MemorySources."""
    steps = flow.steps
    children: dict = {s.id: [] for s in steps}
    for s in steps:
        for position, i in enumerate(s.inputs):
            children[i].append((s.id, position if s.kind in TAGGED else None))
    states: dict = {s.id: {} for s in steps}
    out: dict = {s.name: [] for s in steps if s.kind is K.SINK}
    # Dead letters go to the flow's dead-letter sink: from several steps, through a merge
    # (each step's letters tagged with its place among them), from one, as they are.
    diverting = [s.id for s in steps if s.kind is K.DEAD_LETTERS]
    letters_sink = flow._dead_letter_sink
    if diverting:
        assert letters_sink is not None, "the reference runs flows with a dead-letter sink (MemorySources have no dlq topic)"
        out[letters_sink.name] = []

    def push(sid: int, meta: Meta, x, key=None) -> None:
        step = steps[sid]
        if step.on_error == "dead-letter" and step.kind is not K.WINDOW:
            results = _applied_or_diverted(step, states[sid], meta, x, key)
        elif step.kind is K.DEAD_LETTERS:
            if type(x) is DeadLetter:
                tag = diverting.index(sid) if len(diverting) > 1 else None
                out[letters_sink.name].append((meta if tag is None else meta.child(tag), x))
            return
        elif step.kind in (K.SOURCE, K.MERGE):  # a merge's input tag is already in meta
            results = [(meta, x, None)]
        elif step.kind is K.KEY_BY:
            results = [(meta, x, step.fn(x))]
        elif step.kind is K.MAP:
            results = [(meta, step.fn(x), None)]
        elif step.kind is K.FLAT_MAP:
            results = [(meta.child(k), y, None) for k, y in enumerate(step.fn(x))]
        elif step.kind is K.FILTER:
            results = [(meta, x, key)] if step.fn(x) else []
        elif step.kind in (K.STATEFUL_MAP, K.STATEFUL_FLAT_MAP):
            table = states[sid]
            if step.state is MapState:
                o = step.fn(_Entries(table.setdefault(key, {})), x)
            else:
                new, o = step.fn(table.get(key), x)
                table[key] = new
            if step.kind is K.STATEFUL_MAP:
                results = [] if o is None else [(meta, o, None)]
            else:
                results = [(meta.child(k), y, None) for k, y in enumerate(o or [])]
        elif step.kind is K.INTERVAL_JOIN:
            iv, side, now = step.interval, meta.child_ids[-1], meta[0]
            lefts, rights = states[sid].setdefault(key, ([], []))
            # the elements no later one can match are gone (their unmatched timers fired)
            lefts[:] = [e for e in lefts if max(e[0], e[0] + iv.upper_ms) >= now]
            rights[:] = [e for e in rights if max(e[0], e[0] - iv.lower_ms) >= now]
            element = [now, meta, x, False]
            if side == 0:
                matches = [r for r in rights if now + iv.lower_ms <= r[0] <= now + iv.upper_ms]
                pairs = [(key, x, r[2]) for r in matches]
                lefts.append(element)
            else:
                matches = [left for left in lefts if left[0] + iv.lower_ms <= now <= left[0] + iv.upper_ms]
                pairs = [(key, left[2], x) for left in matches]
                rights.append(element)
            for other in matches:
                other[3] = True
            element[3] = bool(matches)
            results = [(meta.child(k), pair, None) for k, pair in enumerate(pairs)]
            if iv.how == "outer" or (iv.how == "left" and side == 0):
                expiry = (max(now, now + iv.upper_ms if side == 0 else now - iv.lower_ms) + 1, -1, -1, -1)
                timers.setdefault(expiry, {})[(sid, key, "interval", id(element))] = (sid, side, element)
        elif step.kind is K.LOOKUP:
            table, side = states[sid], meta.child_ids[-1]
            if side == 1:
                table[key] = x
                results = []
            else:
                results = [(meta, (x, table.get(key)), None)]
        elif step.kind is K.WINDOW and (event := _event_ms(step, meta, x)) is not None and type(event) is DeadLetter:
            results = [(meta, event, None)]
        elif step.kind is K.WINDOW and isinstance(step.window.assigner, Session):
            spec = step.window
            close = _close(event + round(spec.assigner.gap * 1000), spec.allowed_lateness)
            if meta[0] >= close[0]:
                results = [(meta, Late(key, x, event / 1000), None)]
            else:
                results = []
                states[sid].setdefault(key, []).append((event, meta, x))
                timers.setdefault(close, {})[(sid, key, None, None)] = sid
        elif step.kind in (K.WINDOW, K.WINDOW_JOIN):
            results = []
            spec, windows = step.window, states[sid]
            event = meta[0] if step.kind is K.WINDOW_JOIN else event
            late = False
            for start, end in _windows_holding(spec.assigner, event):
                close = _close(end, spec.allowed_lateness)
                if meta[0] >= close[0]:
                    late = True
                    continue
                state = windows.get((key, start, end))
                windows[(key, start, end)] = spec.step(state, x if spec.pairs is None else (meta.child_ids[-1], x))[0]
                timers.setdefault(close, {})[(sid, key, start, end)] = sid
            if late:
                results = [(meta, Late(key, x, event / 1000), None)]
        elif step.kind is K.SINK:
            out[step.name].append((meta, x))
            return
        for m, y, k in results:
            for c, tag in children[sid]:
                push(c, m if tag is None else m.child(tag), y, k)

    inputs = []
    for s in steps:
        if s.kind is K.SOURCE:
            assert isinstance(s.source, MemorySource)
            n, timestamp = s.source.partitions(), s.source.timestamp
            running: dict = {}  # partition -> running max of the timestamps, ms
            for i, x in enumerate(s.source.items):
                ts = i
                if timestamp is not None:
                    ts = running[i % n] = max(running.get(i % n, float("-inf")), math.floor(timestamp(x) * 1000))
                inputs.append((Meta(ts, s.id, i % n, i), s.id, x))
    timers: dict = {}  # close time -> {(step id, key, start_ms, end_ms): window step id (or an interval join's element)}

    def fire(before) -> None:
        """Emit the windows whose close time is below ``before``, in close time order."""
        while timers and min(timers) < before:
            close = min(timers)
            results = []
            for (_, key, start, end), sid in timers.pop(close).items():
                if start == "interval":  # an interval join's element that may leave unmatched
                    sid, side, (_, m, x, matched) = sid
                    if not matched:
                        meta = Meta(*close, (_key_order(key), side, *m[:4], *m[4]))
                        results.append((meta, sid, (key, x, None) if side == 0 else (key, None, x)))
                    continue
                spec = steps[sid].window
                if start is None:  # sessions: the key's open elements, split where events are a gap apart
                    results += _closed_sessions(states[sid], key, spec, close, sid)
                    continue
                state = states[sid].pop((key, start, end))
                if spec.pairs is not None:
                    results += [(Meta(*close, (_key_order(key), start, i)), sid, p) for i, p in enumerate(spec.pairs(key, state))]
                    continue
                meta = Meta(*close, (_key_order(key), start))
                results.append((meta, sid, WindowResult(key, start / 1000, end / 1000, spec.result(state))))
            for meta, sid, r in sorted(results, key=lambda e: e[0]):
                for c, tag in children[sid]:
                    push(c, meta if tag is None else meta.child(tag), r)

    for meta, sid, x in sorted(inputs, key=lambda e: e[0]):  # t order
        fire(meta)
        push(sid, meta, x)
    fire(TOP)
    return {name: [p for _, p in sorted(v, key=lambda e: e[0])] for name, v in out.items()}


def _windows_holding(assigner, event_ms: int) -> list:
    """From the windows' definition, not the implementation's arithmetic: every ``[s, s +
    size)`` with ``s`` a multiple of the slide (since 0) that holds ``event_ms``, oldest first."""
    size, slide = round(assigner.size * 1000), round(assigner.slide * 1000)
    start, out = event_ms - event_ms % slide, []  # the latest start at or below the event
    while start + size > event_ms:
        out.append((start, start + size))
        start -= slide
    return out[::-1]


def _close(end_ms: int, allowed_lateness: float) -> tuple:
    """When a window ending at ``end_ms`` closes, as the windows' documentation defines it:
    above every element whose source time is below ``end + allowed_lateness`` (ms, rounded
    up), below every element at or past it."""
    return (end_ms + math.ceil(allowed_lateness * 1000), -1, -1, -1)


def _closed_sessions(open_elements: dict, key, spec, close: tuple, sid: int) -> list:
    """The sessions of ``key`` that close at ``close``, as results; their elements leave ``open_elements``."""
    gap, out, sessions = spec.assigner.gap_ms, [], []
    for e in sorted(open_elements.get(key, [])):
        if sessions and e[0] < sessions[-1][-1][0] + gap:
            sessions[-1].append(e)
        else:
            sessions.append([e])
    for session in sessions:
        start, last = session[0][0], session[-1][0]
        if _close(last + gap, spec.allowed_lateness) != close:
            continue
        acc = None
        for _, _, x in sorted(session, key=lambda e: e[1]):  # t order
            acc = spec.step(acc, x)[0]
        out.append((Meta(*close, (_key_order(key), start)), sid, WindowResult(key, start / 1000, (last + gap) / 1000, spec.result(acc))))
        for e in session:
            open_elements[key].remove(e)
    return out


def _dead_letter(step: str, meta: Meta, x, exc: BaseException) -> DeadLetter:
    """What the documentation says a dead letter holds: the step, the element, its t, the
    error, and a traceback of the user's frames alone (called in the ``except`` of the frame
    that called the user's function, whose own frame it leaves out)."""
    frames = exc.__traceback__.tb_next if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None else exc.__traceback__
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    return DeadLetter(step, x, (meta[0], meta[1], meta[2], meta[3], tuple(meta[4])), f"{type(exc).__name__}: {exc}", text)


def _hash32(key) -> int:
    """The documented stable hash of a key: CRC-32 of its encoding (str: UTF-8; int and bool:
    16 bytes little-endian; bytes: CRC xor 0x5BD1E995; None: 0x9E3779B1; a float equal to an
    int hashes as the int, others as their 8 bytes xor 0x27D4EB2F; a tuple chains the CRC of
    its items' hashes from 0x345678)."""
    if isinstance(key, bool) or type(key) is int:
        return zlib.crc32(int(key).to_bytes(16, "little", signed=True)) if -(2**127) <= key < 2**127 else zlib.crc32(str(key).encode())
    if type(key) is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if type(key) is bytes:
        return zlib.crc32(key) ^ 0x5BD1E995
    if key is None:
        return 0x9E3779B1
    if type(key) is float:
        return _hash32(int(key)) if key.is_integer() else zlib.crc32(struct.pack("<d", key)) ^ 0x27D4EB2F
    if type(key) is tuple:
        h = 0x345678
        for item in key:
            h = zlib.crc32(_hash32(item).to_bytes(4, "little"), h)
        return h
    raise TypeError(f"no stable hash for {key!r}")


def _key_order(key) -> int:
    """Where a key's results go among those closing at the same time: its 64-bit hash, the
    stable hash then the stable hash of ``(key, "salt")``."""
    return (_hash32(key) << 32) | _hash32((key, "salt"))


def _event_ms(step, meta: Meta, x):
    """A window step's event time of ``x`` (ms), or its dead letter if the timestamp function
    raises under on_error="dead-letter" (called from this frame, as the runtime calls it)."""
    timestamp = step.window.timestamp
    if timestamp is None:
        return meta[0]
    try:
        return math.floor(timestamp(x) * 1000)
    except Exception as exc:
        if step.on_error != "dead-letter":
            raise
        return _dead_letter(step.name, meta, x, exc)


def _applied_or_diverted(step, table: dict, meta: Meta, x, key) -> list:
    """A step with on_error="dead-letter": its results, or the element's dead letter (its
    user function called from this frame, as the runtime calls it, for the same traceback)."""
    kind, flat = step.kind, step.kind in (K.FLAT_MAP, K.STATEFUL_FLAT_MAP)
    try:
        if kind is K.MAP:
            return [(meta, step.fn(x), None)]
        if kind is K.FILTER:
            return [(meta, x, key)] if step.fn(x) else []
        if kind is K.KEY_BY:
            return [(meta, x, step.fn(x))]
        if kind is K.FLAT_MAP:
            results = []
            for k, y in enumerate(step.fn(x)):
                results.append((meta.child(k), y, None))
            return results
        if step.state is MapState:
            entries = dict(table.get(key, {}))  # its writes kept only if it does not raise
            o = step.fn(_Entries(entries), x)
            table[key] = entries
        else:
            new, o = step.fn(table.get(key), x)
            table[key] = new
    except Exception as exc:
        letter = _dead_letter(step.name, meta, x, exc)
        return [(meta.child(0) if flat else meta, letter, step.name if kind is K.KEY_BY else None)]
    if kind is K.STATEFUL_MAP:
        return [] if o is None else [(meta, o, None)]
    return [(meta.child(k), y, None) for k, y in enumerate(o or [])]


class _Entries:
    """The MapState interface over a plain dict: what a key's entries are, applied in t order."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def get(self, entry, default=None):
        return self.data.get(entry, default)

    def put(self, entry, value) -> None:
        self.data[entry] = value

    def remove(self, entry) -> None:
        self.data.pop(entry, None)

    def __contains__(self, entry) -> bool:
        return entry in self.data

    def __len__(self) -> int:
        return len(self.data)


def crashed_runs_differing(flow: Flow, expected: dict, seeds: int, enough=None) -> tuple:
    """Exactly-once runs of ``flow`` on the simulator for seeds 0..seeds-1 (parallelism 1-3,
    snapshots every 5, 10 or 20 ms, one or two crashes each): ``(seeds whose output of a sink
    of expected differs, with their crash points; recoveries that restored a committed snapshot)``.
    ``enough(seeds run, restored)``: stop before ``seeds`` once it holds."""
    from driftstream.engine.model.config import RunConfig
    from driftstream.engine.runtime.simulator import Simulation

    wrong, restored = [], 0
    for seed in range(seeds):
        config = RunConfig(seed=seed, guarantee="exactly-once", snapshot_interval=(5, 10, 20)[seed % 3] / 1000)
        sim = Simulation(flow.plan(1 + seed % 3), config, crashes=1 + seed % 2)
        result = sim.run()
        if any(result.output(sink) != want for sink, want in expected.items()):
            wrong.append((seed, sim.crash_points))
        restored += sum(sid is not None for sid in sim.recoveries)
        if enough is not None and enough(seed + 1, restored):
            break
    return wrong, restored


#: flow name -> the FileSink content of its failure-free run, once per test session
_FAILURE_FREE: dict = {}


def failure_free_output(name: str, tmp_path_factory, run) -> list:
    """The FileSink content (payloads and Metas) that ``run(out_dir)``, a failure-free run of
    the flow ``name`` into a FileSink named "out" in ``out_dir``, writes: what every
    exactly-once run of that flow must equal. It depends on the flow alone (an element's
    Meta is its source, partition and index, not its timing), so it runs once per session
    and every test that compares with it gets a copy."""
    if name not in _FAILURE_FREE:
        from driftstream.engine.connectors.file_sink import read_file_sink

        out = tmp_path_factory.mktemp(f"{name}-ref")
        run(out)
        _FAILURE_FREE[name] = read_file_sink(out, "out")
    return list(_FAILURE_FREE[name])
