"""Batches of keyed elements in a seeded arrival order, for the re-execution tests: shuffled,
cut into batches of 1-4, a retraction now and then (a tombstone and the element again), and a
watermark now and then that never passes an element still to come."""

from __future__ import annotations

import random
from typing import Iterator, Optional

from driftstream.ordering.meta import tombstone_of


def batches(rng: random.Random, elements: list, advance: float = 0.3) -> Iterator[tuple]:
    """``(batch, watermark or None)`` pairs: apply the batch, then advance to the watermark."""
    elements = list(elements)
    rng.shuffle(elements)
    watermark = 0
    while elements:
        batch = [elements.pop() for _ in range(min(len(elements), rng.randint(1, 4)))]
        if rng.random() < 0.2 and batch:  # a tombstone and the element again, as a retraction does
            m, p, k = batch[0]
            batch += [(tombstone_of(m), p, k), (m, p, k)]
        moved: Optional[tuple] = None
        if rng.random() < advance:
            watermark = min([watermark + 1] + [m[0] for m, _, _ in elements] or [watermark + 1])
            moved = (watermark,)
        yield batch, moved
