"""BatchDrain: queued batches processed a chunk per callback, held while the cache is over budget."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from driftstream.engine.runtime import batch_drain
from driftstream.engine.runtime.batch_drain import BatchDrain


class Runtime:
    """The StageRuntime surface the drain uses."""

    holding = False
    more = False

    def __init__(self) -> None:
        self.calls: list = []

    def receive_many(self, batches: list) -> None:
        self.calls.append(sum(len(b.items) for b in batches))


class Snapshots:
    def __init__(self, over: int = 0) -> None:
        self.over, self.slice_s = over, 0.0

    def over_budget(self) -> bool:
        self.over -= 1
        return self.over >= 0


def batch(n: int):
    return SimpleNamespace(items=[None] * n)


def run(drain: BatchDrain, batches: list, wait: float = 0.05) -> None:
    async def main():
        for b in batches:
            drain.push(b)
        await asyncio.sleep(wait)

    asyncio.run(main())


def test_a_backlog_is_processed_a_chunk_per_callback_and_flushed_after_each(monkeypatch):
    monkeypatch.setattr(batch_drain, "DRAIN_CHUNK", 100)
    rt, flushes = Runtime(), []
    drain = BatchDrain(rt, Snapshots(), lambda fn, *a: fn(*a) is None, lambda: flushes.append(rt.more))
    run(drain, [batch(60)] * 5)
    assert rt.calls == [120, 120, 60]  # whole batches, until a chunk's worth
    assert flushes == [True, True, False]  # more queued behind the first two


def test_over_budget_it_waits_for_the_snapshot_writer_before_processing():
    rt, snapshots = Runtime(), Snapshots(over=3)
    seen_over = []
    drain = BatchDrain(rt, snapshots, lambda fn, *a: (seen_over.append(snapshots.over), fn(*a))[1] is None, lambda: None)
    run(drain, [batch(10)])
    assert rt.calls == [10]
    assert seen_over == [-1]  # processed only once the cache was back under its budget


def test_a_closed_drain_processes_nothing_more():
    rt = Runtime()
    drain = BatchDrain(rt, Snapshots(), lambda fn, *a: fn(*a) is None, lambda: None)

    async def main():
        drain.push(batch(5))
        drain.close()  # the incarnation was reset before its callback ran
        await asyncio.sleep(0.02)

    asyncio.run(main())
    assert rt.calls == []


def test_a_failed_run_processes_nothing():
    rt, flushes = Runtime(), []
    drain = BatchDrain(rt, Snapshots(), lambda fn, *a: False, lambda: flushes.append(1))
    run(drain, [batch(5)])
    assert rt.calls == [] and flushes == []
