"""Completed snapshots on their way from the acker to the supervisor, on the data plane.

The acker takes a whole schedule of snapshots in one call (:meth:`AckerActor.snapshots`)
and sends each as it completes, a framed message on a TCP connection to the
supervisor's :class:`SnapshotInbox`; the supervisor's watch loop reads them
through a :class:`SnapshotStream` and commits each manifest within milliseconds.

Why not Ray: a Ray streaming generator (the previous carrier) cost ~1 ms of CPU
on each side per item (an async actor yielding 400 items 10 ms apart, CPU from
/proc less an idle loop), and at 50 ms snapshots it was most of what exactly-once
still cost the acker, which also pushes the watermarks every element waits for.
A framed message costs ~0.15 ms (see :mod:`.transport`).

>>> inbox = SnapshotInbox("127.0.0.1")
>>> stream = SnapshotStream(inbox, number=1, first_id=5, patience=10.0)
>>> inbox.queue.put(SnapshotTaken(0, (4, "from an abandoned stream")))  # ignored
>>> inbox.queue.put(SnapshotTaken(1, (5, (7,), {}, [], 0.0, 0.01)))
>>> inbox.queue.put(ScheduleEnded(1))
>>> stream.wait(1.0), stream.take()[0], stream.next_id
(True, 5, 6)
>>> stream.wait(1.0), stream.take()                 # the schedule has ended
(True, None)
>>> inbox.close()
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Optional

from driftstream.engine.model.data_plane import DataPlaneTLS, PlaneKey
from driftstream.engine.runtime.protocol import ScheduleEnded, SnapshotTaken  # noqa: F401  (SnapshotTaken: the doctest)
from driftstream.engine.runtime.transport import Endpoint

_EMPTY = object()


class SnapshotInbox:
    """A data-plane endpoint in a thread of its own, listening on ``host``: every message
    a peer sends lands in ``queue`` as it arrives, where a blocking reader takes it.

    Peers connect with ``key`` (its own secret, not a run's: the inbox outlives recoveries;
    the run's key file and TLS files, if any).
    Messages are ``(kind, stream number, body)``; see :class:`SnapshotStream`.
    """

    def __init__(self, host: str, tls: Optional[DataPlaneTLS] = None, key_file: Optional[str] = None) -> None:
        self.key = PlaneKey.new(tls, key_file)
        self.queue: queue.Queue = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="snapshot-inbox", daemon=True)
        self._thread.start()
        self._endpoint = Endpoint(self.key, self.queue.put)
        self.address: tuple = self._call(self._endpoint.listen(host))

    async def _shut(self) -> None:
        # The connections' tasks end here, on a running loop: left pending, they are destroyed
        # with the closed loop and log "Event loop is closed" in a process that lives on (a warm
        # coordinator).
        await self._endpoint.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    def close(self) -> None:
        """Stop listening, end the connections' tasks and the thread."""
        self._call(self._shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class SnapshotStream:
    """The snapshots of one schedule, number ``number``, as the acker sends them to ``inbox``.

    ``next_id`` is the id the acker takes next; an abandoned stream may have begun
    it, so a later stream starts past it. Messages of other (abandoned) streams are
    dropped. An item later than ``patience`` seconds after the last means the acker
    hangs (see :meth:`overdue`).
    """

    def __init__(self, inbox: SnapshotInbox, number: int, first_id: int, patience: float) -> None:
        self.inbox = inbox
        self.number = number
        self.next_id = first_id
        self.patience = patience
        self.deadline = time.time() + patience
        self.call: Any = None  # the acker's call running the schedule (a Ray ref), set by the supervisor
        self._next: Any = _EMPTY

    def wait(self, timeout: float) -> bool:
        """Block until this stream's next item (or its end) has arrived, at most ``timeout``
        seconds; True if it has. O(1) per message of the inbox."""
        end = time.time() + timeout
        while self._next is _EMPTY:
            try:
                message = self.inbox.queue.get(timeout=max(0.0, end - time.time()))
            except queue.Empty:
                return False
            if message.stream == self.number:
                self._next = None if type(message) is ScheduleEnded else message.snapshot
        return True

    def take(self) -> Optional[tuple]:
        """The next snapshot ``(id, T, parts, missing, started, took_s)`` once :meth:`wait`
        said it has arrived; None when the schedule has ended."""
        item, self._next = self._next, _EMPTY
        if item is _EMPTY:
            raise RuntimeError("take() before wait() said the next item has arrived")
        if item is not None:
            self.next_id = item[0] + 1
            self.deadline = time.time() + self.patience
        return item

    def overdue(self) -> bool:
        return time.time() > self.deadline
