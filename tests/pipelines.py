"""Random pipelines for the determinism properties: fan-out, filter, and keyed
stateful stages with non-commutative state (concatenation, list append)."""

from __future__ import annotations

from hypothesis import strategies as st

from driftstream.engine import Flow, MapState
from driftstream.engine.testing import MemorySink, MemorySource


def fan(kv):
    k, v = kv
    return [(k, v + str(j)) for j in range(len(v) % 3)]  # 0, 1 or 2 outputs


def keep(kv):
    return (sum(map(ord, kv[1])) % 4) != 0


def concat(state, kv):
    new = (state or "") + kv[1][:1]
    return new, (kv[0], new)


def append(state, kv):
    new = (state or ()) + (kv[1][-1:],)
    return new, (kv[1][:1], ",".join(new))


def flat_concat(state, kv):
    new = (state or "") + kv[1][:1]
    return new, [(kv[0], new)] * (len(new) % 3)


def pages(entries, kv):
    """Entry state (MapState): each value a page of its key; emits how many pages, and drops
    a page whose value's length is 3 (removes happen too)."""
    k, v = kv
    if len(v) == 3:
        entries.remove(v[:1])
    else:
        entries.put(v[:1], entries.get(v[:1], "") + v)
    return [(k, f"{v[:1]}{len(entries)}")] * (1 + len(v) % 2)


def first_char(kv):
    return kv[1][:1]


def first_key(kv):
    return kv[0]


OPS = {
    "fan": lambda s: s.flat_map(fan),
    "filter": lambda s: s.filter(keep),
    "concat": lambda s: s.key_by(first_key).stateful_map(concat),
    "rekey_append": lambda s: s.key_by(first_char).stateful_map(append),
    "flat_concat": lambda s: s.key_by(first_key).stateful_flat_map(flat_concat),
    "pages": lambda s: s.key_by(first_key).stateful_flat_map(pages, state=MapState),
}

keys = st.sampled_from("abcd")
values = st.text(alphabet="xyzw", min_size=1, max_size=3)
inputs = st.lists(st.tuples(keys, values), max_size=40)
ops = st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=5)


def build(name: str, data: list, op_names: list, partitions: int = 2) -> Flow:
    """One flow: a source, the ops in order, one sink named 'out'."""
    flow = Flow(name)
    s = flow.source(MemorySource(data, partitions=partitions))
    for op in op_names:
        s = OPS[op](s)
    s.sink(MemorySink("out"))
    return flow


#: the case the issue names: state -> re-key -> state, with fan-out and a filter
STATE_REKEY_STATE = ["fan", "concat", "filter", "rekey_append"]

#: the same with entry state (MapState) at the end: its snapshots write entries
STATE_REKEY_ENTRIES = ["fan", "concat", "filter", "pages"]
