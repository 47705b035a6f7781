"""The peers an actor saw die: their data-plane connections ended while one of its
incarnations ran.

>>> import asyncio
>>> lost = LostPeers(ignore=frozenset({"old"}))
>>> lost.add("old"); lost.add("by_key/1"); asyncio.run(lost.wait())
['by_key/1']
"""

from __future__ import annotations

import asyncio


class LostPeers:
    """The peers whose data-plane connection ended while one incarnation of an actor ran:
    their processes died (alone or with their node). One per incarnation, so connections
    that a reset closes on purpose never count for the next one. ``ignore``: peers whose death
    was answered already (a replica's, seen late: not a new one)."""

    def __init__(self, ignore: frozenset = frozenset()) -> None:
        self.names: set = set()
        self.event = asyncio.Event()
        self.ignore = ignore

    def add(self, name: str) -> None:
        if name in self.ignore:
            return
        self.names.add(name)
        self.event.set()

    async def wait(self) -> list:
        await self.event.wait()
        await asyncio.sleep(0.05)  # the peers of one lost node go within milliseconds: one answer
        return sorted(self.names)


#: What a retired actor's :meth:`LostPeers.wait` answers (no peer has this name).
RETIRED = "<retired>"
