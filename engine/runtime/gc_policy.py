"""How a stage process keeps the cyclic garbage collector off its long-lived state.

A stateful instance holds millions of long-lived containers (an inverted index's posting
lists); a full collection over them paused a process for 100+ ms. States are acyclic
values, freed by reference counting when replaced, frozen or not: moving what survived
out of the collector's reach (``gc.freeze``) gives up only cyclic garbage that young
collections have long since found. The Ray actors freeze every second and after each
full collection; in-process benchmarks install the same hook, so they measure the same
engine.

>>> import gc
>>> install(); freeze_after_full_collection in gc.callbacks
True
>>> uninstall(); freeze_after_full_collection in gc.callbacks
False
"""

from __future__ import annotations

import gc


def freeze_after_full_collection(phase: str, info: dict) -> None:
    """A ``gc.callbacks`` hook: what survived a full collection is frozen, so the next one
    looks only at what came since (the same objects the periodic freeze would take)."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def install() -> None:
    """Freeze after every full collection, in this process (once, however often called)."""
    if freeze_after_full_collection not in gc.callbacks:
        gc.callbacks.append(freeze_after_full_collection)


def uninstall() -> None:
    """Take the hook out again."""
    while freeze_after_full_collection in gc.callbacks:
        gc.callbacks.remove(freeze_after_full_collection)
