"""SinkWriters: a thread per sink writes its bundles in order; the loop hears of each write."""

from __future__ import annotations

import asyncio
import threading
import time

from driftstream.engine.runtime.sink_writers import SinkWriters


class SlowSink:
    def __init__(self, fail_on=None) -> None:
        self.written: list = []
        self.threads: set = set()
        self.fail_on = fail_on

    def write(self, bundle) -> None:
        time.sleep(0.005)
        self.threads.add(threading.get_ident())
        if bundle == self.fail_on:
            raise OSError("broker gone")
        self.written.append(bundle)


def test_a_sink_s_bundles_are_written_in_order_off_the_event_loop_and_each_is_reported():
    sink, reports = SlowSink(fail_on="b2"), []

    async def main():
        writers = SinkWriters([7])
        done = asyncio.Event()
        for b in ("b1", "b2", "b3"):
            writers.write(7, sink, b, lambda error, b=b: (reports.append((b, error)), b == "b3" and done.set()))
        assert not writers.idle.is_set()
        await asyncio.wait_for(done.wait(), 5)
        writers.close()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert sink.written == ["b1", "b3"]
    assert [b for b, _ in reports] == ["b1", "b2", "b3"]
    assert isinstance(reports[1][1], OSError) and reports[0][1] is None
    assert loop_thread not in sink.threads and len(sink.threads) == 1


def test_closing_drops_the_queued_writes_without_reporting_them():
    sink, reports = SlowSink(), []

    async def main():
        writers = SinkWriters([0])
        for b in range(20):
            writers.write(0, sink, b, reports.append)
        writers.close()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert len(sink.written) < 20 and len(reports) <= len(sink.written)
