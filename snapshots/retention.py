"""Which committed snapshots a store keeps: the newest ``keep`` usable manifests and, for each
base the newest is built on, the newest usable manifest before that base, so that one damaged
base or delta of the newest chain still leaves an independent snapshot to fall back to.
Pure: the store lists and deletes, this decides.

>>> links = {1: ([], [1]), 2: ([1], [1]), 3: ([1, 2], [1]), 4: ([], [4]), 5: ([4], [4])}
>>> kept, required = kept_snapshots([1, 2, 3, 4, 5], links.get, keep=2)
>>> sorted(kept), sorted(required)
([3, 4, 5], [1, 2, 4])
"""

from __future__ import annotations

import bisect
from typing import Callable, Optional


def kept_snapshots(usable: list, links_of: Callable[[int], Optional[tuple]], keep: int,
                   pinned: Optional[Callable[[int], bool]] = None) -> tuple:
    """``(kept, required)`` for the usable committed ids ``usable`` (ascending): the manifests
    kept as snapshots to restore, and every snapshot whose files a kept one is built on
    (``links_of(id)`` gives a manifest's ``(requires, bases)``, see ``manifest_text.links_in``).
    Nothing is decided (two empty sets) while fewer than ``keep`` are usable. ``pinned``: the
    newest usable id it holds for is kept too (``verify="sample:N"``: the newest snapshot a vote
    certified, which a vote's rollback restores).
    O(kept × log(usable)) plus the kept manifests' links.

    >>> sorted(kept_snapshots([1, 2, 3, 4, 5], {i: ([i], [i]) for i in range(1, 6)}.get, keep=2, pinned=lambda i: i % 3 == 0)[0])
    [3, 4, 5]
    """
    window = usable[-keep:]
    if len(window) < keep:
        return set(), set()
    requires, bases = links_of(window[-1])
    kept = set(window)
    # For each base the newest is built on, the newest manifest before it: the one before
    # the oldest base is independent of the newest now, the others will be once the
    # participants on older bases take new ones. Without "bases" any required snapshot may be one.
    for base in (bases if bases is not None else {*requires, window[-1]}):
        below = bisect.bisect_left(usable, base)
        if below:
            kept.add(usable[below - 1])
    if pinned is not None:
        kept.update(next(([sid] for sid in reversed(usable) if pinned(sid)), []))
    required = {i for sid in kept for i in links_of(sid)[0]}
    return kept, required
