"""SourcePump: reads while its reader has credit, hands batches over, flushes, waits and wakes."""

from __future__ import annotations

import asyncio

from driftstream.engine.connectors.source_reader import SourceReader
from driftstream.engine.testing import MemorySource
from driftstream.ordering.meta import TOP


class Stage:
    """What the pump drives: records the batches and the flushes' ``more``."""

    def __init__(self, ok: bool = True) -> None:
        self.got: list = []
        self.flushes: list = []
        self.failures: list = []
        self.ok = ok

    def process(self, items: list) -> bool:
        self.got.extend(p for _, p in items)
        return self.ok

    def flush(self, more: bool) -> int:
        self.flushes.append(more)
        return 0


def pump_of(reader: SourceReader, stage: Stage, batch_size: int = 2, alive=lambda: True):
    from driftstream.engine.runtime.source_pump import SourcePump

    return SourcePump(reader, 0, batch_size, process=stage.process, flush=stage.flush, fail=stage.failures.append, alive=alive)


def reader_of(items, max_inflight: int = 100, batch_size: int = 2) -> SourceReader:
    return SourceReader(MemorySource(items), source_id=0, instance=0, instances=1, max_inflight=max_inflight, batch_size=batch_size)


def test_a_bounded_source_is_read_to_its_end_and_the_last_flush_says_nothing_more_comes():
    stage = Stage()

    async def main():
        pump = pump_of(reader_of(range(5)), stage)
        pump.start()
        await asyncio.wait_for(pump.task, 5)

    asyncio.run(main())
    assert stage.got == [0, 1, 2, 3, 4]
    assert stage.flushes[0] is True  # a full batch: receivers wait for the next one
    assert stage.flushes[-1] is False


def test_out_of_credit_it_waits_until_a_watermark_returns_credit_and_wakes_it():
    stage = Stage()

    async def main():
        reader = reader_of(range(10), max_inflight=3, batch_size=1)
        pump = pump_of(reader, stage, batch_size=1)
        pump.start()
        await asyncio.sleep(0.05)
        held = list(stage.got)
        pump.on_watermark(TOP)  # everything emitted so far settled
        await asyncio.sleep(0.05)
        pump.stop()
        return held

    held = asyncio.run(main())
    assert held == [0, 1, 2]
    assert stage.got[:4] == [0, 1, 2, 3]


def test_a_reader_that_raises_fails_the_run_and_stops_the_pump():
    stage = Stage()
    boom = RuntimeError("broker gone")

    async def main():
        reader = reader_of(range(5))
        reader.poll = lambda n: (_ for _ in ()).throw(boom)
        pump = pump_of(reader, stage)
        pump.start()
        await asyncio.wait_for(pump.task, 5)

    asyncio.run(main())
    assert stage.failures == [boom] and stage.got == []


def test_a_failed_run_stops_it_and_no_resume_starts_it_again():
    stage = Stage()
    failed = []

    async def main():
        pump = pump_of(reader_of(range(100)), stage, batch_size=1, alive=lambda: not failed)
        pump.start()
        await asyncio.sleep(0)
        failed.append(True)
        await asyncio.wait_for(pump.task, 5)
        pump.task = None
        pump.resume()
        return pump.task

    assert asyncio.run(main()) is None
    assert len(stage.got) < 100
    assert stage.flushes[-1] is not False  # no final flush for a failed run


def test_paused_it_reads_nothing_and_resumed_it_reads_on():
    stage = Stage()

    async def main():
        pump = pump_of(reader_of(range(50)), stage, batch_size=1)
        pump.start()
        await asyncio.sleep(0)
        await pump.pause()
        seen = len(stage.got)
        await asyncio.sleep(0.02)
        still = len(stage.got)
        pump.resume()
        await asyncio.wait_for(pump.task, 5)
        return seen, still

    seen, still = asyncio.run(main())
    assert seen == still < 50
    assert stage.got == list(range(50))


def test_an_instance_of_a_source_stage_gets_a_pump_over_its_own_partitions_and_others_none():
    from driftstream.engine import Flow
    from driftstream.engine.model.config import InstanceConfig
    from driftstream.engine.model.plan import Instance
    from driftstream.engine.runtime.source_pump import SourcePump
    from driftstream.engine.testing import MemorySink

    f = Flow("pumped")
    f.source(MemorySource(list(range(8)), partitions=4), name="src").key_by(lambda x: x % 2).map(lambda x: x).sink(MemorySink("out"))
    plan = f.plan(2)
    stage = Stage()

    async def main():
        pumps = {key: SourcePump.of_instance(plan, key, InstanceConfig(batch_size=8), process=stage.process, flush=stage.flush,
                                             fail=stage.failures.append) for key in plan.instances}
        sources = {key: p for key, p in pumps.items() if p is not None}
        for p in sources.values():
            p.start()
            await asyncio.wait_for(p.task, 5)
        return pumps, sources

    pumps, sources = asyncio.run(main())
    assert sorted(sources) == [Instance(0, 0), Instance(0, 1)]
    assert all(pumps[k] is None for k in plan.instances if k.stage != 0)
    assert [sources[k].reader.numbers for k in sorted(sources)] == [[0, 2], [1, 3]]
    assert [sources[k].source_index for k in sorted(sources)] == [0, 1]
    assert sorted(stage.got) == list(range(8))


def test_each_read_reports_how_long_it_took_and_a_held_owner_stops_reading_until_it_lets_go():
    """The owner paces its snapshot writer by the reads' times (``took``) and holds reading
    back while a state cache is over its budget (``held``)."""
    from driftstream.engine.runtime.source_pump import SourcePump

    stage, took, hold = Stage(), [], {"on": True}

    async def main():
        pump = SourcePump(reader_of(range(6)), 0, 2, process=stage.process, flush=stage.flush, fail=stage.failures.append,
                          took=took.append, held=lambda: hold["on"])
        pump.start()
        await asyncio.sleep(0.05)
        held = list(stage.got)
        hold["on"] = False
        await asyncio.wait_for(pump.task, 5)
        return held

    assert asyncio.run(main()) == []
    assert stage.got == [0, 1, 2, 3, 4, 5]
    assert len(took) == 3 and all(seconds >= 0 for seconds in took)


def test_records_that_make_much_work_are_read_fewer_at_a_time_and_a_full_short_read_says_more_comes():
    from driftstream.engine.runtime.read_size import WORK_PER_READ
    from driftstream.engine.runtime.source_pump import SourcePump

    stage, sizes = Stage(), []
    per_record = WORK_PER_READ // 4  # a document that makes a quarter of a read's work

    def process(items: list) -> bool:
        sizes.append(len(items))
        stage.work += per_record * len(items)
        return stage.process(items)

    stage.work = 0

    async def main():
        pump = SourcePump(reader_of(range(40), batch_size=16), 0, 16, process=process, flush=stage.flush,
                          fail=stage.failures.append, work=lambda: stage.work)
        pump.start()
        await asyncio.wait_for(pump.task, 5)

    asyncio.run(main())
    assert stage.got == list(range(40))
    assert sizes[0] == 16 and set(sizes[1:-1]) == {4}, sizes  # after the first read: a read's work each
    assert stage.flushes[1] is True  # 4 of 4 asked: the receivers wait for the next read


def test_records_of_little_work_keep_the_batch_size():
    stage = Stage()

    async def main():
        from driftstream.engine.runtime.source_pump import SourcePump

        pump = SourcePump(reader_of(range(12), batch_size=4), 0, 4, process=stage.process, flush=stage.flush,
                          fail=stage.failures.append, work=lambda: len(stage.got) * 3)
        pump.start()
        await asyncio.wait_for(pump.task, 5)
        return pump.size.next

    assert asyncio.run(main()) == 4
    assert stage.got == list(range(12))


class SparseStage(Stage):
    """A stage whose steps make one element for its receivers per ``per`` records read, held
    until a flush (``pending``: what the pump lingers by)."""

    def __init__(self, per: int) -> None:
        super().__init__()
        self.per, self.waiting, self.sent = per, 0, []

    def process(self, items: list) -> bool:
        self.waiting += len(items) // self.per
        return super().process(items)

    def flush(self, more: bool) -> int:
        self.sent.append(self.waiting)
        self.waiting = 0
        return super().flush(more)


def lingering_pump(reader: SourceReader, stage: SparseStage, batch_size: int):
    from driftstream.engine.runtime.source_pump import SourcePump

    return SourcePump(reader, 0, batch_size, process=stage.process, flush=stage.flush, fail=stage.failures.append,
                      pending=lambda: stage.waiting)


def test_in_a_backlog_the_output_of_consecutive_reads_goes_out_in_one_flush_of_at_most_a_batch():
    """Each message costs its sender, its receiver and the acker alike whatever it holds: a
    source whose reads make a few elements each sends them a batch at a time (issue 57)."""
    stage = SparseStage(per=4)

    async def main():
        pump = lingering_pump(reader_of(range(160), max_inflight=1000, batch_size=16), stage, batch_size=16)
        pump.start()
        await asyncio.wait_for(pump.task, 5)

    asyncio.run(main())
    assert stage.got == list(range(160))
    sent = [n for n in stage.sent if n]
    assert sum(sent) == 40 and max(sent) <= 16
    assert len(sent) == 3, stage.sent  # 10 reads of 4 elements each: 16, 16, then the last 8 at the end
    assert stage.flushes[-1] is False


def test_a_read_that_is_not_full_and_a_reader_out_of_credit_flush_at_once():
    """At the live edge (a read short of what it asked, nothing left) nothing waits; out of
    credit, what lingered goes out before the pump waits for the watermark its acks move."""
    live = SparseStage(per=1)

    async def at_the_live_edge():
        pump = lingering_pump(reader_of(range(3), batch_size=16), live, batch_size=16)
        pump.start()
        await asyncio.sleep(0.05)
        return list(live.sent)

    assert asyncio.run(at_the_live_edge())[0] == 3  # the first flush: the whole short read

    stage = SparseStage(per=4)

    async def out_of_credit():
        reader = reader_of(range(64), max_inflight=8, batch_size=4)
        pump = lingering_pump(reader, stage, batch_size=16)
        pump.start()
        await asyncio.sleep(0.05)
        held = (list(stage.got), sum(stage.sent), stage.waiting)
        pump.stop()
        return held

    got, sent, waiting = asyncio.run(out_of_credit())
    assert got == list(range(8))  # two reads of 4, then out of credit
    assert (sent, waiting) == (2, 0)  # both reads' elements sent before it waits
