"""Restoring at another parallelism: each new instance gets exactly the keys of its key
groups, with the states of the snapshot, whatever mix of bases and deltas the old
instances' chains hold (real RocksDB files, a local store, the reassignment of
engine/model/reassignment.py), the fused plan at parallelism 1 among them (its keyed step in
the source's stage); and a snapshot from before key groups regroups its keys."""

from __future__ import annotations

import asyncio

import msgpack
from hypothesis import HealthCheck, given, settings, strategies as st
from rocksdict import Options, Rdict

from driftstream.engine import Flow
from driftstream.engine.model.manifest import Manifest, SnapshotPart, manifest_of
from driftstream.engine.model.plan import Instance
from driftstream.engine.model.reassignment import reassign
from driftstream.engine.runtime.stage_snapshots import StageSnapshots
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.ordering.key_groups import KeyGroups
from driftstream.snapshots.changelog import DELTA_FILE
from driftstream.snapshots.codec import encode, encode_key
from driftstream.snapshots.state_keys import StateKeys
from driftstream.snapshots.store import SnapshotStore

M = 16
KEYS = StateKeys(KeyGroups(M))


def append(state, x):
    return (state or ()) + (x,), None


def _plan(parallelism: int):
    flow = Flow("f", max_parallelism=M)
    flow.source(MemorySource([1]), name="src").key_by(str, name="k").stateful_map(append, name="n").sink(MemorySink("o"))
    return flow.plan(parallelism)


def _keyed(plan) -> int:
    """The index of the stage holding step "n": its own at parallelism > 1, the source's in a fused plan at 1."""
    return plan.stage_of[next(s.id for s in plan.steps if s.name == "n")]


def _take(snaps: StageSnapshots, snapshot_id: int) -> SnapshotPart:
    async def go():
        done = asyncio.get_running_loop().create_future()
        snaps.take(snapshot_id, (0,), None, done.set_result)
        return await done

    return asyncio.run(go())


def _run_old(store: str, n: int, history: list) -> tuple:
    """Instances of a parallelism-n run fold ``history`` (per snapshot: key -> inputs), each
    key in the instance owning its group; returns (manifest of the last snapshot, expected states)."""
    plan, groups = _plan(n), KeyGroups(M)
    k = _keyed(plan)
    snaps = [StageSnapshots(store, plan.participant(Instance(k, i)), None, base_every_s=0 if i % 2 else 3600) for i in range(n)]
    caches = [s.backend("n", append, False, KEYS) for s in snaps]
    expected: dict = {}
    parts: dict = {}
    for sid, changes in enumerate(history, start=1):
        for key, inputs in changes.items():
            state = expected.get(key)
            for x in inputs:
                state = append(state, x)[0]
            expected[key] = state
            caches[groups.owner(groups.group_of(key), n)].fold(key, state, inputs)
        parts = {Instance(k, i): _take(s, sid) for i, s in enumerate(snaps)}
    for s in snaps:
        s.close()
    return manifest_of(plan, len(history), (0,), parts, missing=[]), expected


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 5), st.integers(1, 5),
       st.lists(st.dictionaries(st.sampled_from([f"w{i}" for i in range(40)]), st.lists(st.integers(0, 9), min_size=1, max_size=3), max_size=12),
                min_size=1, max_size=4))
def test_every_new_instance_restores_exactly_its_groups(tmp_path_factory, n1, n2, history):
    store = str(tmp_path_factory.mktemp("store"))
    manifest, expected = _run_old(store, n1, history)
    manifest = Manifest.from_json(manifest.to_json())
    new_plan, groups = _plan(n2), KeyGroups(M)
    parts = reassign(manifest, new_plan)
    union: dict = {}
    for i in range(n2):
        k = _keyed(new_plan)
        part = parts.get(Instance(k, i).label, SnapshotPart())
        snaps = StageSnapshots(store, new_plan.participant(Instance(k, i)), part)
        snaps.backend("n", append, False, KEYS)
        got = dict(snaps.backends["n"].items())
        snaps.close()
        owned = groups.range_of(i, n2)
        assert all(groups.group_of(k) in owned for k in got), (i, got)
        union.update(got)
    assert union == {k: v for k, v in expected.items() if v is not None}


def test_a_rescaled_instance_writes_a_base_first_then_goes_on_with_deltas(tmp_path):
    store = str(tmp_path / "store")
    manifest, expected = _run_old(store, 2, [{"a": [1], "b": [2], "c": [3]}, {"a": [4]}])
    part = reassign(manifest, _plan(1))["0/0"]  # fused: "n" runs in the source's stage
    assert len(part.states["n"]) == 2  # a slice of each old instance
    snaps = StageSnapshots(store, "f-src-0", part, base_every_s=3600)
    cache = snaps.backend("n", append, False, KEYS)
    cache.fold("a", append(expected["a"], 5)[0], [5])
    first = _take(snaps, 10).states["n"]
    cache.fold("b", append(expected["b"], 6)[0], [6])
    second = _take(snaps, 11).states["n"]
    snaps.close()
    assert first == {"participant": "f-src-0-n", "base": 10, "deltas": []}
    assert second == {"participant": "f-src-0-n", "base": 10, "deltas": [11]}
    again = StageSnapshots(store, "f-src-0", SnapshotPart(states={"n": second}))
    again.backend("n", append, False, KEYS)
    assert dict(again.backends["n"].items()) == {"a": (1, 4, 5), "b": (2, 6), "c": (3,)}
    again.close()


def test_a_snapshot_from_before_key_groups_restores_at_any_parallelism(tmp_path):
    """Version 1: RocksDB rows and format-3 delta rows keyed by encode_key alone, instances
    by hash modulo parallelism. Reassigned, every new instance reads every old participant
    and keeps the keys of its groups, regrouped."""
    store = SnapshotStore(str(tmp_path / "store"))
    words = [f"w{i}" for i in range(30)]
    for i in range(2):  # the old instances' bases: any key in either
        db = Rdict(str(tmp_path / f"old{i}"), Options(raw_mode=True))
        for w in words[i::2]:
            db[encode_key(w)] = encode((w,))
        db.close()
        store.upload(1, f"f-k-{i}-n", tmp_path / f"old{i}")
    delta = msgpack.packb([3, [[encode_key("w0"), 1, encode(["x"])], [encode_key("w1"), 2, b""]]], use_bin_type=True)
    store.put_file(2, "f-k-0-n", DELTA_FILE, delta)
    v1 = {"snapshot_id": 2, "flow": "f", "parallelism": 2, "t": [0], "requires": [1],
          "parts": {f"1/{i}": {"states": {"n": {"participant": f"f-k-{i}-n", "base": 1, "deltas": [2] if i == 0 else []}}, "sources": {}}
                    for i in range(2)}}
    manifest = Manifest.from_json(v1)
    assert manifest.legacy and manifest.version == 1
    expected = {w: (w,) for w in words if w != "w1"}
    expected["w0"] = ("w0", "x")
    for n in (1, 2, 3):
        plan, union = _plan(n), {}
        k = _keyed(plan)
        for i, part in ((i, reassign(manifest, plan).get(Instance(k, i).label, SnapshotPart())) for i in range(n)):
            assert all(s.get("legacy") for s in part.states.get("n", []))
            snaps = StageSnapshots(str(tmp_path / "store"), plan.participant(Instance(k, i)), part)
            snaps.backend("n", append, False, KEYS)
            got = dict(snaps.backends["n"].items())
            snaps.close()
            assert all(KeyGroups(M).owner(KeyGroups(M).group_of(w), n) == i for w in got)
            union.update(got)
        assert union == expected, n
