"""StageRuntime.output_durable_through: a snapshot at T may be answered only once every
output below T has been acknowledged by its sink (a replay from T would not produce it)."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.runtime.stage import StageRuntime
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.ordering.meta import BOTTOM, TOP, Meta


def runtime(with_sink: bool = True) -> tuple:
    """A one-stage runtime whose bundle writes stay in flight until the test acknowledges them."""
    flow = Flow("durable")
    stream = flow.source(MemorySource(["a", "b", "c"])).map(str.upper)
    if with_sink:
        stream.sink(MemorySink("out"))
    else:
        stream.filter(lambda x: False).sink(MemorySink("out"))
    in_flight: list = []
    rt = StageRuntime(flow.plan(1), stage_index=0, instance=0, seed=1, bundle_writer=lambda sid, sink, b: in_flight.append((sid, b)))
    return rt, in_flight


def test_output_is_durable_below_a_watermark_once_its_bundle_is_acknowledged():
    rt, in_flight = runtime()
    assert rt.output_durable_through() == BOTTOM
    rt.process_source([(Meta(0, 0, 0, 0), "a"), (Meta(2, 0, 0, 1), "b")])
    rt.on_watermark((1,))
    assert len(in_flight) == 1 and rt.output_durable_through() == BOTTOM  # "A" released, not acknowledged
    rt.on_watermark((3,))  # "B" settles while "A" is in flight: it waits in the barrier
    assert len(in_flight) == 1 and rt.output_durable_through() == BOTTOM
    rt.bundle_written(*in_flight.pop())
    assert rt.output_durable_through() == (1,)  # "A"'s bundle; "B" left in the next one
    assert len(in_flight) == 1
    rt.bundle_written(*in_flight.pop())
    assert rt.output_durable_through() == (3,)
    rt.on_watermark((5,))  # nothing to release: durable at once
    assert not in_flight and rt.output_durable_through() == (5,)


def test_without_output_everything_is_durable():
    rt, in_flight = runtime(with_sink=False)
    rt.process_source([(Meta(0, 0, 0, 0), "a")])
    rt.on_watermark((1,))
    assert not in_flight and rt.output_durable_through() == (1,)
    rt.on_watermark(TOP)
    assert rt.output_durable_through() == TOP


def test_latency_samples_stay_bounded_and_still_join():
    """A long run keeps at most ``max_samples`` per kind; the kept emit and release samples
    still meet on the same elements (strides are powers of two on both sides)."""
    flow = Flow("samples")
    flow.source(MemorySource(list(range(10)))).map(lambda x: x).sink(MemorySink("out"))
    rt = StageRuntime(flow.plan(1), stage_index=0, instance=0, seed=1, max_samples=100)
    for start in range(0, 5000, 50):
        rt.process_source([(Meta(i, 0, 0, i), i) for i in range(start, start + 50)])
        rt.on_watermark((start + 50,))
    assert len(rt.emit_times) <= 100 and len(rt.release_times) <= 100
    joined = rt.emit_times.keys() & rt.release_times.keys()
    assert len(joined) >= 50  # evenly spread over the whole run, not only its start
    offsets = sorted(t[3] for t in joined)
    assert offsets[0] < 500 and offsets[-1] > 4500


def test_a_window_stage_keeps_its_results_samples_bounded():
    """A window's results are sampled when it fires (their latency starts at its close): a
    window stage of a long run keeps at most ``max_samples`` of them, as a source does."""
    from driftstream.engine.runtime.stage import Batch
    from driftstream.engine.windows import Tumbling

    flow = Flow("windows")
    flow.source(MemorySource([]), name="s").key_by(lambda x: x % 7, name="k").window(Tumbling(1)).count().sink(MemorySink("out"))
    plan = flow.plan(1, fuse=False)  # the keyed stage of its own, which batches enter
    stage = next(i for i, s in enumerate(plan.stages) if s.source_id < 0)
    rt = StageRuntime(plan, stage_index=stage, instance=0, seed=1, max_samples=64, merging=False)
    entry = plan.stages[stage].step_ids[0]
    for second in range(300):  # 7 keys a second: 2,100 results
        items = [((1000 * second + k, 0, 0, 7 * second + k, (), False), k, k) for k in range(7)]
        rt.receive(Batch(entry, second + 1, [items[0][0][:4]], items, sender="s"))
        rt.on_watermark((1000 * (second + 1),))
    assert rt.counts["out"] == 7 * 299  # the last close's results wait for a watermark past it
    assert 0 < len(rt.emit_times) <= 64 and 0 < len(rt.release_times) <= 64
    late = [t for t in rt.emit_times.keys() & rt.release_times.keys() if t[0] > 150_000]
    assert late  # samples of the run's second half still join: thinning did not drop every result


def test_every_key_goes_to_the_owner_of_its_group_whether_its_owner_was_remembered_or_not(monkeypatch):
    """Routing remembers the owners of str, int and float keys; a key routed from memory, after
    the memory was cleared, equal to a key of another type routed before (``2.0`` after ``2``,
    ``True`` after ``1``), or of a type not remembered (a tuple) goes to the owner of its key
    group all the same."""
    import driftstream.engine.runtime.outbound as outbound_module

    monkeypatch.setattr(outbound_module, "OWNERS_CACHED", 16)  # cleared every few batches
    keys = [f"k{i}" for i in range(40)] + list(range(40)) + [float(i) for i in range(10)] + [i + 0.5 for i in range(10)] + [("a", i) for i in range(10)] + [True]
    flow = Flow("routing")
    flow.source(MemorySource([])).key_by(lambda x: x).stateful_map(lambda s, x: (x, x)).sink(MemorySink("out"))
    plan = flow.plan(4)
    rt = StageRuntime(plan, stage_index=0, instance=0, seed=1)
    router = plan.key_groups.router(4)
    for round_ in range(3):
        rt.process_source([(Meta(0, 0, 0, round_ * 1000 + i), k) for i, k in enumerate(keys)])
        routed = {(dst, key) for _, dst, batch in rt.take_batches() for _, _, key in batch.items}
        assert routed == {(router[plan.key_groups.group_of(k)], k) for k in keys}


def test_a_batch_partly_released_by_the_merge_holds_the_watermark_only_at_what_it_still_holds():
    """Sender A's batch runs ahead of sender B's: the merge releases A's items up to B's last
    and holds the rest. The watermark then passes what was released (so B's source, waiting
    for it to return credit, reads on), never an item still held, and passes everything once
    the batch is done."""
    from driftstream.engine.runtime.stage import Batch
    from driftstream.ordering.acker import Acker

    flow = Flow("merge")
    flow.source(MemorySource([]), name="s").key_by(lambda x: x, name="k").stateful_map(lambda s, x: (x, x), name="keep").sink(MemorySink("out"))
    plan = flow.plan(1, fuse=False)  # the keyed stage of its own, which batches enter
    stage = next(i for i, s in enumerate(plan.stages) if s.source_id < 0)
    entry = plan.stages[stage].step_ids[0]
    rt = StageRuntime(plan, stage_index=stage, instance=0, seed=1)
    acker = Acker(sources=1)
    a_items = [((t, 0, 0, t, (), False), f"a{t}", f"a{t}") for t in (1, 9, 5)]  # not in t order: a stateful step emits key by key
    b_items = [((t, 0, 1, t, (), False), f"b{t}", f"b{t}") for t in (2, 3)]
    batches = [Batch(entry, 0xA, [(1, 0, 0, 1)], a_items, sender="A"), Batch(entry, 0xB, [(2, 0, 1, 2)], b_items, sender="B", more=True)]
    acker.update({(1, 0, 0, 1): 0xA, (2, 0, 1, 2): 0xB}, source=0, bound=TOP)  # the senders' XORs; all is sent
    rt.receive_many(batches)
    assert rt.holding  # a9 and a5 wait: B said more is coming
    acker.update(rt.take_acks())
    assert acker.watermark == (5, 0, 0, 5)  # a1, b2, b3 done; a5 still held (behind a9 in its batch)
    rt.release_held(everything=True)
    acker.update(rt.take_acks())
    assert acker.watermark == TOP and not rt.holding


def test_the_stage_drives_every_operator_by_its_watermark_side():
    """The stage sorts no operator by class: any operator's on_watermark outputs go on to the
    steps after it (a stand-in here for a step with timers of its own)."""
    from driftstream.engine.runtime.operators import Operator

    class Ticks(Operator):
        """Passes nothing on from run(); one output per watermark, at the watermark's time."""

        __slots__ = ("settled",)

        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.settled = []

        def run(self, items: list) -> list:
            return []

        def settle(self, watermark: tuple) -> None:
            self.settled.append(watermark)

        def on_watermark(self, watermark: tuple) -> list:
            return [((watermark[0], -1, -1, -1, (), False), f"tick {watermark[0]}", None)]

    flow = Flow("ticks")
    flow.source(MemorySource([])).map(str, name="ticks").sink(MemorySink("out"))
    rt = StageRuntime(flow.plan(1), stage_index=0, instance=0, seed=1)
    tick = Ticks("ticks")
    rt.operators[rt.stage.step_ids[1]] = tick
    rt.on_watermark((5, 0, 0, 0))
    rt.on_watermark(TOP)
    assert tick.settled == [(5, 0, 0, 0), TOP]
    assert [p for _, p in rt.collected()["out"]] == ["tick 5"]  # "tick inf" lies at TOP: never below a watermark
