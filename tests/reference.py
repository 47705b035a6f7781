"""A sequential reference: apply a flow to its whole input one element at a time in t order.

No batching, no parallelism, no late arrivals: the output every runtime must match.
"""

from __future__ import annotations

from driftstream.engine.api.flow import Flow
from driftstream.engine import MapState
from driftstream.engine.testing import MemorySource
from driftstream.ordering.meta import Meta


def reference_outputs(flow: Flow) -> dict:
    """``{sink name: [payload, ...]}`` in t order, for flows over MemorySources."""
    steps = flow.steps
    children: dict = {s.id: [] for s in steps}
    for s in steps:
        for position, i in enumerate(s.inputs):
            children[i].append((s.id, position if s.kind == "merge" else None))
    states: dict = {s.id: {} for s in steps}
    out: dict = {s.name: [] for s in steps if s.kind == "sink"}

    def push(sid: int, meta: Meta, x, key=None) -> None:
        step = steps[sid]
        if step.kind in ("source", "merge"):  # a merge's input tag is already in meta
            results = [(meta, x, None)]
        elif step.kind == "key_by":
            results = [(meta, x, step.fn(x))]
        elif step.kind == "map":
            results = [(meta, step.fn(x), None)]
        elif step.kind == "flat_map":
            results = [(meta.child(k), y, None) for k, y in enumerate(step.fn(x))]
        elif step.kind == "filter":
            results = [(meta, x, None)] if step.fn(x) else []
        elif step.kind in ("stateful_map", "stateful_flat_map"):
            table = states[sid]
            if step.state is MapState:
                o = step.fn(_Entries(table.setdefault(key, {})), x)
            else:
                new, o = step.fn(table.get(key), x)
                table[key] = new
            if step.kind == "stateful_map":
                results = [] if o is None else [(meta, o, None)]
            else:
                results = [(meta.child(k), y, None) for k, y in enumerate(o or [])]
        elif step.kind == "sink":
            out[step.name].append((meta, x))
            return
        for m, y, k in results:
            for c, tag in children[sid]:
                push(c, m if tag is None else m.child(tag), y, k)

    inputs = []
    for s in steps:
        if s.kind == "source":
            assert isinstance(s.source, MemorySource)
            n = s.source.partitions()
            inputs += [(Meta(i, s.id, i % n, i), s.id, x) for i, x in enumerate(s.source.items)]
    for meta, sid, x in sorted(inputs, key=lambda e: e[0]):  # t order
        push(sid, meta, x)
    return {name: [p for _, p in sorted(v, key=lambda e: e[0])] for name, v in out.items()}


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
