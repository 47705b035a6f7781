"""One simulated incarnation: what its instances send becomes the scheduler's moves, and its
moves alone (no crash, no snapshot) carry a flow to its output in any seeded order."""

from __future__ import annotations

import random

from driftstream.engine import Flow
from driftstream.engine.model.config import InstanceConfig
from driftstream.engine.runtime.protocol import Ack
from driftstream.engine.runtime.simulated_incarnation import SimulatedIncarnation
from driftstream.engine.runtime.simulated_instances import SimulatedInstances
from driftstream.engine.testing import MemorySink, MemorySource


def _plan():
    f = Flow("incarnation")
    f.source(MemorySource(list(range(12)), partitions=2)).key_by(lambda x: x % 3, name="mod").map(lambda x: x + 1, name="plus").sink(MemorySink("out"))
    return f.plan(2, fuse=False)  # two stages: the sources' batches travel as data


def _incarnation(seed: int) -> tuple:
    plan, live, rng = _plan(), SimulatedInstances(), random.Random(seed)
    inc = SimulatedIncarnation(plan, live, rng, batch_size=3, aligned=None, shards=0,
                               send_control=lambda *m: inc.enqueue(*m), maybe_crash=lambda point, chance: False)
    for n, instance in enumerate(plan.instances):
        live.start(plan, instance, InstanceConfig(batch_size=3), seed=n, base_every_s=0.0,
                   bundle_writer=inc.bundle_writer(instance), send=inc.sender(instance))
    return plan, live, inc


def test_what_the_instances_send_becomes_moves():
    plan, live, inc = _incarnation(0)
    try:
        assert [m.__name__ for m in inc.deliveries(reading=True)] == ["read_source"]
        assert inc.deliveries(reading=False) == [] and inc.completions() == []  # a stopped source: nothing moves
        inc.read_source()
        assert inc.data and all(stage == 1 for stage, _, _ in inc.data)  # batches to the keyed stage
        acks = [m for (sender, receiver), q in inc.control.items() for m in q if receiver == "acker"]
        assert len(acks) == 1 and type(acks[0]) is Ack
        assert {"deliver_data", "deliver_control"} <= {m.__name__ for m in inc.deliveries(reading=False)}
    finally:
        live.close()


def test_the_moves_alone_carry_the_flow_to_its_output_in_any_order():
    for seed in range(5):
        plan, live, inc = _incarnation(seed)
        try:
            moves = 0
            while moves < 10_000 and (choices := inc.deliveries(reading=True) + inc.completions()):
                inc.rng.choice(choices)()
                moves += 1
            assert not inc.data and not inc.writes and not any(inc.control.values())
            assert live.result(plan, 0.0).output("out") == [x + 1 for x in range(12)], seed
        finally:
            live.close()
