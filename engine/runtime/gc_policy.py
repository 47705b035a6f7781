"""How a stage process keeps the cyclic garbage collector off its long-lived state.

A stateful instance holds millions of long-lived containers (an inverted index's posting
lists); a full collection over them paused a process for 100+ ms. States are acyclic
values, freed by reference counting when replaced, frozen or not: moving what survived
out of the collector's reach (``gc.freeze``) gives up only cyclic garbage that young
collections have long since found. The Ray actors freeze every second and after each
full collection; in-process benchmarks install the same hook, so they measure the same
engine.

Young collections come every :data:`THRESHOLDS` ``[0]`` allocations, more than a stage
makes between two freezes (and the freeze resets the count), so in practice the freeze is
the only collection. In a backlog every element outlives a young collection (it stays in a
log, an overlay, a barrier until the watermark passes it): each one traversed only what the
next freeze takes anyway and freed nothing, at a cost that grows with the heap its
referents are spread over (figures: docs/architecture.md). A burst past ``THRESHOLDS[0]``
allocations within one freeze interval still meets a young collection.

>>> import gc
>>> install(); freeze_after_full_collection in gc.callbacks, gc.get_threshold() == THRESHOLDS
(True, True)
>>> uninstall(); freeze_after_full_collection in gc.callbacks, gc.get_threshold() == THRESHOLDS
(False, False)
"""

from __future__ import annotations

import asyncio
import gc

#: the collector's thresholds while installed (allocations per young collection, young
#: collections per middle one, middle per full one)
THRESHOLDS = (1_000_000, 50, 100)
_before: list = []  # the thresholds install() replaced


def freeze_after_full_collection(phase: str, info: dict) -> None:
    """A ``gc.callbacks`` hook: what survived a full collection is frozen, so the next one
    looks only at what came since (the same objects the periodic freeze would take)."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def install() -> None:
    """Freeze after every full collection and collect at :data:`THRESHOLDS`, in this process
    (once, however often called)."""
    if freeze_after_full_collection not in gc.callbacks:
        gc.callbacks.append(freeze_after_full_collection)
        _before[:] = gc.get_threshold()
        gc.set_threshold(*THRESHOLDS)


def uninstall() -> None:
    """Take the hook out again, and put back the thresholds it replaced."""
    while freeze_after_full_collection in gc.callbacks:
        gc.callbacks.remove(freeze_after_full_collection)
    if _before:
        gc.set_threshold(*_before)
        _before.clear()


async def freeze_survivors(every_s: float) -> None:
    """Install the hook, then every ``every_s`` move the objects that survived until now out
    of the collector's reach (``gc.freeze``): a stage actor's task, for its process's life.

    A stateful actor's settled states are millions of long-lived containers (an inverted
    index's posting lists); one full collection over them paused the event loop for
    100+ ms, the tail of every latency figure. States are acyclic values, freed by
    reference counting when replaced, frozen or not; what freezing gives up is only
    cyclic garbage older than ``every_s``, which young collections have long since found.

    A backlog still made full collections within the second (a stateful instance
    allocates states faster than that), each over everything since the last freeze:
    16% of a stateful instance's CPU over a 6,000-document backlog, pauses up to
    150 ms. Survivors of a full collection are frozen as well
    (:func:`freeze_after_full_collection`): 6%, pauses under 50 ms.
    """
    install()
    while True:
        await asyncio.sleep(every_s)
        gc.freeze()
