"""One retrying write policy for the sinks whose writes can fail for a while: a broker or a
server out of reach, a table commit lost to another writer's.

Flink's ``AsyncSinkWriter`` is the model: a sink says how to send a bundle and which of its
errors are worth another try, and the policy owns the loop. What is particular here: a
failed write may have landed in part, so before each retry the writer asks the partition
what it holds (its ``t_last``) and sends only the rest. A bundle is in t order and a sink
partition has one writer, so what landed is a prefix, and nothing is written twice.

- a *transient* error (connection lost, server restarting) is retried with backoff (0.05 s,
  doubling to 1 s; one WARNING per outage, each further attempt at DEBUG, an INFO once the
  write goes through) until ``retry_s`` has passed since the write began, then the write fails
  with the sink's ``failure`` error naming the sink, where it writes, the setting to raise
  and the last error; reading back what landed counts against the same ``retry_s``;
- a *refused* error (credentials, a certificate) is raised at once: no retry fixes it;
- a *conflict* (another writer committed first; the commit was refused whole) is retried at
  once, at most ``max_conflicts`` times in a row;
- any other error (the data does not fit, the history cannot tell ``t_last``) is raised as it is.

>>> held = []
>>> def send(bundle, items):                 # lands the first item, then the connection drops
...     held.append(items[0])
...     if len(held) == 1:
...         raise ConnectionResetError("peer reset")
...     held.extend(items[1:])
>>> landed = lambda timeout_s: Meta(held[-1], 0, 0, held[-1])
>>> writer = RetryingWriter("out", "db[0]", RetryPolicy(retry_s=5), WriteErrors(transient=(OSError,)))
>>> writer.write(Bundle([(Meta(i, 0, 0, i), i) for i in (1, 2, 3)]), [1, 2, 3], send, landed)
>>> held
[1, 2, 3]
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from driftstream.barriers.bundle import Bundle
from driftstream.ordering.meta import Meta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often a sink partition's write is retried."""

    #: how long a write is retried from its start before it fails (the sink's ``retry_s``)
    retry_s: float = 60.0
    #: the first pause after a transient error; each next one doubles, up to ``max_pause_s``
    first_pause_s: float = 0.05
    max_pause_s: float = 1.0
    #: conflicts (commits lost to another writer's) retried at once, in a row, before failing
    max_conflicts: int = 50


@dataclass(frozen=True)
class WriteErrors:
    """Which of a sink's errors are which (tuples of exception types, for ``except``)."""

    #: retried with backoff within ``retry_s``, what landed read back first
    transient: tuple
    #: raised at once, even where one is also a transient type (checked first)
    refused: tuple = ()
    #: retried at once, what landed read back first, up to ``max_conflicts`` in a row
    conflicts: tuple = ()
    #: what a write still failing past ``retry_s`` raises, from the last error
    failure: type = ConnectionError
    #: the setting the failure names, e.g. ``"KafkaSink retry_s"``
    setting: str = "retry_s"


def _repr(exc: BaseException) -> str:
    return repr(exc)


class RetryingWriter:
    """Writes bundles to one sink partition under a :class:`RetryPolicy`.

    ``sink``: the sink's name and ``target``: where this partition writes (``topic[3]``, a
    table), both named by every log line and error. ``on_error``: called after each transient
    error, before the retry (e.g. drop a broken connection). ``describe``: an error as the
    messages show it.
    """

    def __init__(self, sink: str, target: str, policy: RetryPolicy, errors: WriteErrors,
                 on_error: Optional[Callable[[], None]] = None, describe: Callable[[BaseException], str] = _repr) -> None:
        self.sink, self.target, self.policy, self.errors = sink, target, policy, errors
        self.on_error, self.describe = on_error, describe
        #: transient errors retried, over the writer's life (for tests and status)
        self.retries = 0

    def write(self, bundle: Bundle, items: Sequence, send: Callable[[Bundle, Any], None],
              landed: Callable[[float], Optional[Meta]]) -> None:
        """Send ``items`` (one per element of ``bundle``, prepared once: rows, records, an
        Arrow table) with ``send(bundle, items)``; after an error that may have landed some,
        ``landed(timeout_s)`` says the Meta of the last element the partition holds (within
        what is left of ``retry_s``), and only the elements after it are sent again."""
        errors, policy = self.errors, self.policy
        deadline, pause, conflicts, resume = time.monotonic() + policy.retry_s, policy.first_pause_s, 0, False
        outage = 0  # transient errors of this write: the first is logged as a WARNING, the rest at DEBUG
        while True:
            try:
                if resume:
                    bundle = bundle.after(landed(max(0.5, deadline - time.monotonic())))
                    items = items[len(items) - len(bundle):]  # what landed is a prefix
                    resume = False
                if len(items):
                    send(bundle, items)
                if outage:
                    log.info("sink %s: a write to %s went through after %d retries", self.sink, self.target, outage)
                return
            except errors.refused:
                raise
            except errors.conflicts as exc:
                resume, conflicts = True, conflicts + 1
                if conflicts >= policy.max_conflicts:
                    raise RuntimeError(f"sink {self.sink!r}: {conflicts} commits to {self.target} in a row lost to other writers") from exc
                log.debug("sink %s: commit %d to %s lost a race (%s); retrying", self.sink, conflicts, self.target, exc)
            except errors.transient as exc:
                resume, outage = True, outage + 1
                self._after_transient(exc, deadline, pause, first=outage == 1)
                pause = min(policy.max_pause_s, pause * 2)

    def _after_transient(self, exc: BaseException, deadline: float, pause: float, first: bool) -> None:
        """Fail past the deadline, else log and wait ``pause`` before the retry: one WARNING
        per outage (``first``: the write's first error), each further attempt at DEBUG."""
        if self.on_error is not None:
            self.on_error()
        if time.monotonic() + pause > deadline:
            raise self.errors.failure(f"sink {self.sink!r}: writes to {self.target} failed for {self.policy.retry_s:g} s "
                                      f"({self.errors.setting}): {self.describe(exc)}") from exc
        self.retries += 1
        if first:
            log.warning("sink %s: a write to %s failed (%s); retrying for up to %g s (%s)", self.sink, self.target, self.describe(exc),
                        self.policy.retry_s, self.errors.setting)
        else:
            log.debug("sink %s: a write to %s failed again (%s); retrying in %.2f s", self.sink, self.target, self.describe(exc), pause)
        time.sleep(pause)
