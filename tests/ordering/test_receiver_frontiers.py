"""A frontier per receiver during a local recovery (ordering/receiver_frontiers.py): over random
DAGs of instances, open times, holds and source bounds, each instance's frontier is at or above
the global watermark, never passes an open time of its upstream cone, never moves back, and
the recovery ends with every instance under the one watermark."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from driftstream.ordering.channel_tables import ChannelAcker
from driftstream.ordering.meta import TOP, successor
from driftstream.ordering.receiver_frontiers import Cones, ReceiverFrontiers


def _dag(n: int, rng: random.Random) -> dict:
    """Instance i -> the instances it sends to (j > i), each edge with chance 1/2."""
    return {i: [j for j in range(i + 1, n) if rng.random() < 0.5] for i in range(n)}


def test_cones_are_the_paths_of_the_dag():
    cones = Cones({0: [1], 1: [2], 2: [], 3: [2]})
    assert cones.upstream[2] == {0, 1, 2, 3} and cones.upstream[1] == {0, 1}
    assert cones.downstream[0] == {0, 1, 2} and cones.downstream[3] == {2, 3}
    # while 1 recovers, 3's output waits for its cone and its downstream's on its side: none
    # (2 is downstream of 1); 0 waits for nothing of 1's
    reach = cones.reach(1)
    assert reach[3] == {3} and reach[0] == {0} and reach[2] == {0, 1, 2, 3}


def _open_in_cone(table: ChannelAcker, cone: frozenset, sources: list) -> tuple:
    """The least time open for a receiver in ``cone``: its channels' entries, holds, source bounds."""
    times = [min(entries) for channel, entries in table.tables.items() if entries and channel[1] in cone]
    times += [t for token, t in table.holds.items() if token[0] in cone]
    times += [successor(table.bounds[i]) for i, s in enumerate(sources) if s in cone]
    return min(times, default=TOP)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 6), seed=st.integers(0, 2**32), moves=st.integers(0, 60))
def test_each_frontier_is_above_the_watermark_below_its_cone_and_the_recovery_ends(n, seed, moves):
    rng = random.Random(seed)
    graph = _dag(n, rng)
    cones = Cones(graph)
    sources = [i for i in range(n) if not any(i in to for to in graph.values())]
    table = ChannelAcker(len(sources))
    t = lambda k: (k, 0, 0, k)  # noqa: E731
    for i, s in enumerate(sources):
        table.update({}, source=(i, s), bound=t(rng.randint(5, 20)))
    channels = [(a, b) for a, to in graph.items() for b in to] + [(a, a) for a in graph]
    xors: dict = {}
    for _ in range(rng.randint(0, 12)):
        key = (rng.choice(channels), t(rng.randint(3, 25)))
        xors[key] = xors.get(key, 0) ^ rng.getrandbits(16) or 1
    table.update(xors)
    victim = rng.randrange(n)
    w = table.watermark
    table.hold((victim, "replay"), t(rng.randint(0, 3)))  # the replacement restores T <= W
    frontiers = ReceiverFrontiers(table, cones, victim, {i: i for i in range(n)}, sources, told=w)
    told = {x: w for x in range(n)}
    for _ in range(moves + 1):
        for x, f in frontiers.due():
            assert f > told[x], "a frontier moved back"
            assert f >= table.watermark, "a frontier below the global watermark"
            assert f <= _open_in_cone(table, cones.upstream[x], sources), f"{x} told {f} past an open time of its cone"
            told[x] = f
        if frontiers.done:
            break
        _move(table, rng, sources, channels, cones, told, t)
    # every source read to the end and everything acked: the recovery ends under one watermark
    for i, s in enumerate(sources):
        table.update({}, source=(i, s), bound=TOP)
    for channel, entries in list(table.tables.items()):
        table.update({(channel, k): v for k, v in entries.items()})
    table.release((victim, "replay"))
    assert not frontiers.due() and frontiers.done
    assert all(f <= table.frontier_raw() for f in told.values())


def _move(table: ChannelAcker, rng: random.Random, sources: list, channels: list, cones: Cones, told: dict, t) -> None:
    """One step of the run: an ack, the hold's release, a source's new bound, or a send (at or
    after the least time open in its sender's cone, where its inputs are, and what it was told:
    the replacement drops its output below the cut)."""
    kind = rng.random()
    open_ = [(ch, k, v) for ch, entries in table.tables.items() for k, v in entries.items()]
    if kind < 0.4 and open_:
        ch, k, v = rng.choice(open_)
        table.update({(ch, k): v})
    elif kind < 0.5:
        for token in list(table.holds):
            table.release(token)
    elif kind < 0.75:
        i = rng.randrange(len(sources))
        table.update({}, source=(i, sources[i]), bound=t(table.bounds[i][0] + rng.randint(0, 4)))
    else:
        ch = rng.choice(channels)
        least = max(told[ch[0]], _open_in_cone(table, cones.upstream[ch[0]], sources))
        if least < TOP:
            table.update({(ch, t(least[0] + rng.randint(0, 5))): rng.getrandbits(16) or 1})


def test_a_frontier_stops_at_the_target_once_converging():
    cones = Cones({0: [1, 2], 1: [], 2: []})
    table = ChannelAcker(1)
    table.update({((0, 1), (3, 0, 0, 3)): 7, ((0, 2), (9, 0, 0, 9)): 3}, source=(0, 0), bound=(20, 0, 0, 20))
    table.hold((1, "replay"), (1, 0, 0, 1))  # 1 failed at W = 2 and restores T = 1
    frontiers = ReceiverFrontiers(table, cones, 1, {0: 0, 1: 1, 2: 2}, [0], told=(2, 0, 0, 2))
    assert dict(frontiers.due()) == {0: (9, 0, 0, 9), 2: (9, 0, 0, 9)}  # not 1: its replay holds it
    frontiers.converge()  # a snapshot is due
    table.update({((0, 2), (9, 0, 0, 9)): 3})  # 2's channel settles: it is not told past the target
    assert frontiers.due() == [] and not frontiers.done
    table.release((1, "replay"))
    table.update({((0, 1), (3, 0, 0, 3)): 7})  # 1 caught up: everything told is under the global frontier
    assert frontiers.due() == [] and frontiers.done
