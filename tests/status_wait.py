"""Polling a running flow's ``status()`` with a deadline, for tests of live figures.

>>> wait_for_status(lambda s: s["running"], handle, "the flow to run")   # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Callable

from driftstream.engine.testing import wait_for_actor


def wait_for_status(condition: Callable[[dict], bool], handle, what: str, timeout: float = 60.0, every: float = 0.05) -> dict:
    """The first ``handle.status()`` that meets ``condition``; fails naming ``what`` (with the
    last status) once ``timeout`` seconds have passed."""
    deadline = time.time() + timeout
    while True:
        status = handle.status()
        if condition(status):
            return status
        assert time.time() < deadline, f"{what} within {timeout:g} s: {status}"
        time.sleep(every)


def kill_after(handle, victim: str, released: int, timeout: float = 120.0) -> None:
    """Once the flow has released ``released`` elements, kill actor ``victim`` (no restart)
    and wait for the recovery that follows."""
    import ray

    def running(s: dict) -> dict:
        assert s.get("running"), f"the flow ended before the kill of {victim}: {s}"
        return s

    wait_for_status(lambda s: running(s).get("released", 0) >= released, handle, f"{released} elements released", timeout)
    recoveries = len(running(handle.status())["recoveries"])
    ray.kill(wait_for_actor(victim, timeout=30), no_restart=True)
    wait_for_status(lambda s: len(running(s)["recoveries"]) > recoveries, handle, f"a recovery from the kill of {victim}", timeout)
