"""The stage actor's side of silent-corruption checks (``verify="reexecute:N"``) and of the
fault hook that tests and benchmarks strike state with: a mixin of
:class:`~driftstream.engine.runtime.actors.StageActor`, which owns ``host``, ``plan`` and ``key``.

A re-run or a settled read that disagreed (:mod:`.reexecuted_step`) exits the process once
the snapshots that may hold the bad value are set aside: the supervisor then recovers as from
any death. On the verifier (``reexecute_on="verifier"``) the acker's last watermark waits for
every instance's :meth:`CorruptionStageSide.drained`.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any, Optional

from driftstream.engine.runtime.reexecuted_step import SilentCorruption, set_aside_since
from driftstream.engine.runtime.state_faults import FAULTS

#: A stage actor's exit status after it caught a silent corruption (verify="reexecute:N")
CORRUPTION_EXIT = 70
#: ... and how long it waits for a commit in flight before it sets the snapshots aside again
CORRUPTION_SETTLE_S = 0.5


class CorruptionStageSide:
    """What a stage actor does when a check finds its state or a result wrong, and the hook
    that strikes one (tests, benchmarks)."""

    host: Any
    plan: Any
    key: Any

    def _corrupted(self, exc: BaseException) -> None:
        """``verify="reexecute:N"``: a re-run or a settled read disagreed (see reexecuted_step.py),
        before anything derived from it left this instance. Its line goes to the log, the
        snapshots that may hold the bad value are set aside, and the process exits: the
        supervisor recovers as from any death (a global rollback to the newest committed
        snapshot left; under recovery="local" this instance alone)."""
        print(f"driftstream {self.plan.actor_name(self.key)}: {exc}", file=sys.stderr, flush=True)
        store = self.host.snapshots.store
        if store is not None and isinstance(exc, SilentCorruption) and exc.record.before is not None:
            set_aside_since(store, exc.record.before, str(exc))
            # A snapshot whose parts were all in may be committing now: its commit lands within
            # this pause (this loop sends no part meanwhile), and is set aside in turn.
            time.sleep(CORRUPTION_SETTLE_S)
            set_aside_since(store, exc.record.before, str(exc))
        os._exit(CORRUPTION_EXIT)

    async def drained(self) -> None:
        """verify="reexecute:N" on the verifier: returns once every batch this instance shipped
        has its verdict (or was given up); a difference found exits the process first."""
        if self.host.verifier is not None:
            await self.host.verifier.drained()

    async def inject_fault(self, kind: str, seed: int) -> Optional[str]:
        """Tests: fault ``kind`` (``"flip"``, ``"flip at rest"``, ``"wrong"``: state_faults.py) in this instance's
        keyed state, seeded; what was struck (None: nothing to strike yet)."""
        fault = FAULTS[kind](self.host, random.Random(seed))
        return None if fault is None else repr(fault)
