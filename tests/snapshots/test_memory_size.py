"""approx_size: the bounded walk gives what the plain recursive definition gives."""

from __future__ import annotations

import sys

from hypothesis import given, strategies as st

from driftstream.snapshots.memory_size import DEPTH, MEASURE_EVERY, MEASURE_FIRST, RECORD_OVERHEAD, SAMPLE, MeanSize, approx_size


def walk(value, depth: int = DEPTH) -> int:
    """The definition: each container's first SAMPLE items, DEPTH levels, scaled to its length."""
    size = sys.getsizeof(value)
    if depth == 0:
        return size
    if type(value) is dict:
        items = [x for kv in list(value.items())[:SAMPLE] for x in kv]
        n = len(value)
    elif type(value) in (list, tuple, set, frozenset):
        items = list(value)[:SAMPLE]
        n = len(value)
    else:
        return size
    if not n:
        return size
    return size + sum(walk(x, depth - 1) for x in items) * n // min(n, SAMPLE)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30), st.binary(max_size=30))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=40),
        st.lists(inner, max_size=20).map(tuple),
        st.frozensets(scalars, max_size=20),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=20),
    ),
    max_leaves=80,
)


@given(values)
def test_approx_size_is_the_bounded_walk(value):
    assert approx_size(value) == walk(value)
    assert approx_size(value, 1) == walk(value, 1)


@given(st.lists(st.one_of(st.integers(), st.lists(st.integers(), max_size=3 * SAMPLE), st.text(max_size=40)), max_size=60),
       st.integers(0, 2 * MEASURE_FIRST))
def test_a_sample_measures_the_stride_and_every_long_container(states, measured_before):
    sizes, got = MeanSize(), {}
    sizes.count, sizes.total = measured_before, measured_before * RECORD_OVERHEAD
    items = list(enumerate(states))
    sizes.sample(items, got)
    every = 1 if measured_before < MEASURE_FIRST else MEASURE_EVERY
    expected = {i for i, s in items if i % every == 0 or (type(s) in (list, str) and len(s) > SAMPLE)}
    assert set(got) == expected
    assert all(got[i] == RECORD_OVERHEAD + approx_size(states[i]) for i in got)
    assert sizes.count == measured_before + len(expected)
    assert sizes.total == measured_before * RECORD_OVERHEAD + sum(got.values())


def test_the_default_budget_is_a_share_of_the_node_per_core_and_never_below_the_floor():
    from driftstream.snapshots.memory_size import DEFAULT_BUDGET_BYTES, node_budget_bytes

    assert node_budget_bytes(memory=24 << 30, cores=2) == 3 << 29  # 1.5 GiB
    assert node_budget_bytes(memory=24 << 30, cores=4) == node_budget_bytes(memory=24 << 30, cores=2) // 2
    assert node_budget_bytes(memory=2 << 30, cores=2) == DEFAULT_BUDGET_BYTES
    assert node_budget_bytes(memory=0, cores=0) == DEFAULT_BUDGET_BYTES
    assert node_budget_bytes() >= DEFAULT_BUDGET_BYTES  # this machine's


def test_a_stage_without_a_budget_takes_its_nodes_and_one_given_keeps_it(tmp_path):
    from driftstream.engine.runtime.stage_snapshots import StageSnapshots
    from driftstream.snapshots.memory_size import node_budget_bytes

    assert StageSnapshots(None, "p").cache_bytes == node_budget_bytes()
    assert StageSnapshots(None, "p", cache_bytes=4096).cache_bytes == 4096
