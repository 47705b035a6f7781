"""An instance's side of ``verify="reexecute:N"`` re-runs on the flow's verifier (another
process, :mod:`.verifier_actor`): batches shipped, the verdicts compared as they come, and the
snapshot parts that a pending verdict may concern held back.

The data path never waits: a shipped batch's outputs go on at once to the next stage, and the
verdict (the verifier compared the re-run with the live outputs and post-state shipped with it)
is taken when it arrives, on the instance's event loop. What a late verdict could not undo is
output a sink holds (an exactly-once recovery skips what its sink already has) and a snapshot
that committed the bad value: so this instance's sink writes and its part of a snapshot wait
until every shipped batch that re-ran anything at or below their time has its verdict (a slow
verifier delays the sinks and the snapshots, not the stages). A verifier that falls behind or dies
never stalls the flow: at most ``bound`` batches are outstanding (past it a sampled batch is not
shipped, counted ``dropped``); a verdict not back within ``deadline`` seconds is given up
(``late``), as is one whose call failed (``lost``: the actor died; Ray restarts it).

>>> from concurrent.futures import Future
>>> from driftstream.ordering.shipped_reexecution import Expected, Verdict
>>> calls, parts, caught = [], [], []
>>> link = VerifierLink(lambda shipment: calls.append(Future()) or calls[-1], bound=1)
>>> link.wire(caught.append, lambda t, part: parts.append(part))
>>> link.submit(None, Expected(((3,), (4,)), (3,)), "sum", "1/0", ())
True
>>> link.full(), link.submit(None, Expected(((5,), (5,)), (5,)), "sum", "1/0", ()), link.dropped
(True, False, 1)
>>> link.hold_part((2,), "p2"); link.hold_part((4,), "p4"); parts       # p4 may hold the batch at 3
['p2']
>>> calls[0].set_result(Verdict([])); parts, caught, link.verified
(['p2', 'p4'], [], 1)
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import Any, Callable, Optional

from driftstream.ordering.shipped_reexecution import Expected, Shipment

from driftstream.engine.runtime.reexecuted_step import CorruptionRecord, SilentCorruption

#: shipped batches without a verdict, per instance, past which a sampled batch is not shipped
BOUND = 32
#: seconds after which a verdict not back is given up (the verifier is stuck or restarting)
DEADLINE_S = 10.0
#: seconds between looks at the verdicts still out, at the run's last watermark
POLL_S = 0.01


def _now(fn: Callable[[], None]) -> None:
    fn()


class VerifierLink:
    """Ships batches with ``call(shipment)`` (a future: ``add_done_callback``, ``result``); its
    callbacks come back through ``post(fn)`` (the actor's loop, from Ray's thread) and its
    deadlines through ``later(seconds, fn)`` (None: none). :meth:`wire` gives it what a
    difference does and where a held snapshot part goes."""

    def __init__(self, call: Callable[[Shipment], Any], post: Callable[[Callable[[], None]], None] = _now,
                 later: Optional[Callable[[float, Callable[[], None]], Any]] = None, bound: int = BOUND,
                 deadline: float = DEADLINE_S) -> None:
        self.call, self.post, self.later, self.bound, self.deadline = call, post, later, bound, deadline
        self.corrupted: Callable[[SilentCorruption], None] = lambda exc: None
        self.release: Callable[[tuple, Any], None] = lambda t, part: None
        self.outstanding: dict = {}  # number -> (Expected, step, instance, watermark)
        self.held: deque = deque()  # (t, what to do once no outstanding batch re-ran below t), in order
        self._numbers = itertools.count()
        self.sent = self.verified = self.dropped = self.lost = self.late = 0
        self.busy_s = 0.0  # wall seconds the batches waited for their verdicts, summed

    @classmethod
    def on_ray(cls, verifier: Any) -> "VerifierLink":
        """A link to the verifier actor ``verifier`` from a stage actor: verdicts come back on
        the event loop the first batch was shipped from."""
        loop: list = []

        def call(shipment: Shipment) -> Any:
            if not loop:
                loop.append(asyncio.get_running_loop())
            return verifier.rerun.remote(shipment).future()

        return cls(call, lambda fn: loop[0].call_soon_threadsafe(fn), lambda seconds, fn: loop[0].call_later(seconds, fn))

    def wire(self, corrupted: Callable[[SilentCorruption], None], release: Callable[[tuple, Any], None]) -> None:
        self.corrupted, self.release = corrupted, release

    def full(self) -> bool:
        """Whether a sampled batch must not be shipped now (``bound`` are outstanding)."""
        return len(self.outstanding) >= self.bound

    def submit(self, shipment: Shipment, expected: Expected, step: str, instance: str, watermark: tuple) -> bool:
        """Ship ``shipment`` (or count it dropped when :meth:`full`); True if shipped."""
        if self.full():
            self.dropped += 1
            return False
        number = next(self._numbers)
        self.outstanding[number] = (expected, step, instance, watermark, time.monotonic())
        self.sent += 1
        self.call(shipment).add_done_callback(lambda future: self.post(lambda: self._back(number, future)))
        if self.later is not None:
            self.later(self.deadline, lambda: self._give_up(number))
        return True

    def _back(self, number: int, future: Any) -> None:
        entry = self.outstanding.pop(number, None)
        if entry is None:
            return  # given up already
        expected, step, instance, watermark, sent_at = entry
        self.busy_s += time.monotonic() - sent_at
        try:
            verdict = future.result()
        except Exception:  # the verifier died (Ray restarts it) or could not load the batch: unchecked
            self.lost += 1
        else:
            self.verified += 1
            found = verdict.found
            if found:
                self.corrupted(SilentCorruption(CorruptionRecord(step, instance, expected.t_range, found, watermark, expected.least_t)))
                return
        self._release_parts()

    def _give_up(self, number: int) -> None:
        if self.outstanding.pop(number, None) is not None:
            self.late += 1
            self._release_parts()

    async def drained(self) -> None:
        """Once every shipped batch has its verdict or was given up (the run's last watermark
        waits for it before its sinks release the rest: a verdict after it would come too late)."""
        while self.outstanding:
            await asyncio.sleep(POLL_S)

    def hold_part(self, t: tuple, part: Any) -> None:
        """This instance's snapshot part at ``t``: released (``release(t, part)``) as :meth:`hold` says."""
        self.hold(t, lambda: self.release(t, part))

    def hold(self, t: Optional[tuple], then: Callable[[], None]) -> None:
        """Do ``then()`` once no outstanding batch re-ran anything at or below ``t`` (a snapshot
        part's T, a sink bundle's last time: what derives from a batch has its times), after
        what was held before it. None: at once, after those."""
        self.held.append((t, then))
        self._release_parts()

    def _release_parts(self) -> None:
        held = self.held
        if not held:
            return
        least = min((entry[0].least_t for entry in self.outstanding.values()), default=None)
        while held and (least is None or held[0][0] is None or held[0][0] < least):
            held.popleft()[1]()

    def stats(self) -> dict:
        """Counts for ``status()``: batches shipped, verified, dropped (the bound), lost (a
        failed call), late (the deadline), outstanding now, and snapshot parts and sink writes held."""
        return {"sent": self.sent, "verified": self.verified, "dropped": self.dropped, "lost": self.lost, "late": self.late,
                "outstanding": len(self.outstanding), "held": len(self.held), "wait_s": round(self.busy_s, 3)}


__all__ = ["BOUND", "DEADLINE_S", "VerifierLink"]
