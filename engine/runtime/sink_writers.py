"""The threads that write a stage instance's released bundles into its sinks.

A sink's ``write`` blocks until the destination has the bundle (a Kafka produce request
acknowledged by every replica, a file fsynced): in a thread of its own per sink, the
event loop goes on processing meanwhile, and one thread per sink keeps its bundles in
release order. ``idle`` is set while no write is outstanding: the last watermark and
the run's report wait on it.

>>> import asyncio
>>> written = []
>>> class ListSink:
...     def write(self, bundle): written.append(bundle)
>>> async def main():
...     writers = SinkWriters([0])
...     done = asyncio.Event()
...     writers.write(0, ListSink(), "b1", lambda error: done.set())
...     await done.wait()
...     writers.close()
>>> asyncio.run(main()); written
['b1']
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional


class SinkWriters:
    """One writer thread per sink step id in ``sink_ids``."""

    def __init__(self, sink_ids: Iterable[int]) -> None:
        self.pools = {sid: ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink") for sid in sink_ids}
        #: set while no write is outstanding (the owner sets it once its written callbacks say so)
        self.idle = asyncio.Event()
        self.idle.set()

    def write(self, sid: int, sink: Any, bundle: Any, written: Callable[[Optional[BaseException]], None]) -> None:
        """Write ``bundle`` with ``sink.write`` in sink ``sid``'s thread; then, in the event loop,
        ``written(None)`` or ``written(the exception it raised)``. Not called if :meth:`close`
        cancelled the write first."""
        self.idle.clear()
        future = asyncio.get_running_loop().run_in_executor(self.pools[sid], sink.write, bundle)
        future.add_done_callback(lambda f: None if f.cancelled() else written(f.exception()))

    def close(self) -> None:
        """Wait for the write in progress of each sink; drop the queued ones."""
        for pool in self.pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
