"""NewestCommitter: tells something outside the flow each committed snapshot's source
positions, on a thread of its own, the newest first.

A :class:`~driftstream.engine.model.connectors.CommitHook` is called in the supervisor's
loop, which must not wait for a broker or a database. This one hands the positions to a
thread: an older snapshot's positions still pending when a newer one's arrive are dropped
(never written after the newer ones), and a failure is counted, logged and superseded by
the next snapshot's. Subclasses say how to write (:meth:`_commit`) and what they are
(:meth:`describe`).

>>> class Printed(NewestCommitter):
...     def _commit(self, offsets): print(offsets)
...     def describe(self): return {"to": "stdout"}
>>> c = Printed("printed"); c.submit({0: 7}); c.close(timeout_s=5)
{0: 7}
>>> c.status()["commits"]
1
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Optional

log = logging.getLogger(__name__)


class NewestCommitter(ABC):
    """Commits ``{partition: offset}`` in the background, newest first. O(1) per submit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.committed: dict = {}
        self.commits = 0
        self.failures = 0
        self.last_error: Optional[str] = None
        self._pending: Optional[dict] = None
        self._busy = False
        self._closing = False
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    @abstractmethod
    def _commit(self, offsets: dict) -> None:
        """Write ``offsets``; raise on failure (the next snapshot's try again)."""

    @abstractmethod
    def describe(self) -> dict:
        """Where the positions go, for ``status()``."""

    def _reset(self) -> None:
        """Drop a client after a failure or at close (the next commit opens a new one)."""

    def submit(self, offsets: dict) -> None:
        """Commit ``offsets`` soon, unless newer ones come first. Returns at once."""
        if not offsets:
            return
        with self._wake:
            self._pending = dict(offsets)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"commit-{self.name}", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                if self._pending is None:
                    return
                offsets, self._pending, self._busy = self._pending, None, True
            try:
                self._commit(offsets)
                self.committed, self.commits, self.last_error = offsets, self.commits + 1, None
            except Exception as exc:  # any failure: counted, and the next snapshot's positions try again
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: positions not committed (%s); the next snapshot's will be", self.name, self.last_error)
                self._reset()
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def status(self) -> dict:
        """For ``status()``: where they go, the positions last committed, commits and failures."""
        return {**self.describe(), "committed": dict(self.committed), "commits": self.commits,
                "failures": self.failures, "last_error": self.last_error}

    def close(self, timeout_s: float = 5.0) -> None:
        """Commit what is pending (waiting up to ``timeout_s``), then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            self._wake.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout_s)
        if self._thread is not None:
            self._thread.join(timeout=0.1)
        if not self._busy:
            self._reset()
