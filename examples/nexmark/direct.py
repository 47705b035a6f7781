"""Each Nexmark query's results computed directly from the events, as a plain Python loop
would: no flow, no simulator. ``bench nexmark`` checks both engines against these (as
multisets, :func:`.flink_queries.check_results`), so neither engine is its own reference.

>>> from driftstream.examples.nexmark.generator import events
>>> rows = direct_results("q7", events(3000, rate=200))
>>> [(r["start"], r["end"]) for r in rows]
[(0.0, 10.0), (10.0, 20.0)]
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Callable

from .queries import QUERIES


def _bids(evs: list) -> list:
    return [e for e in evs if e["kind"] == "bid"]


def q1(evs: list) -> list:
    """Every bid, its price in euros."""
    return [{"auction": b["auction"], "bidder": b["bidder"], "price": round(b["price"] * 0.908), "time": b["time"]} for b in _bids(evs)]


def q2(evs: list) -> list:
    """The bids on auctions whose id is a multiple of 123."""
    return [{"auction": b["auction"], "price": b["price"]} for b in _bids(evs) if b["auction"] % 123 == 0]


def q3(evs: list) -> list:
    """Auctions of category 10 whose seller (registered before) lives in OR, ID or CA."""
    local: dict = {}
    rows = []
    for e in evs:
        if e["kind"] == "person" and e["state"] in ("OR", "ID", "CA"):
            local[e["id"]] = e
        elif e["kind"] == "auction" and e["category"] == 10 and e["seller"] in local:
            p = local[e["seller"]]
            rows.append({"name": p["name"], "city": p["city"], "state": p["state"], "auction": e["id"]})
    return rows


def q5(evs: list) -> list:
    """Per sliding window of 10 s every 2 s (ends at multiples of 2), the auctions with the most bids."""
    counts: dict = defaultdict(Counter)
    for b in _bids(evs):
        first_end = (math.floor(b["time"] / 2) + 1) * 2  # the windows [end - 10, end) holding the bid
        for end in range(first_end, first_end + 10, 2):
            counts[end][b["auction"]] += 1
    rows = []
    for end, per_auction in sorted(counts.items()):
        top = max(per_auction.values())
        rows.append({"start": float(end - 10), "end": float(end), "bids": top, "auctions": sorted(a for a, n in per_auction.items() if n == top)})
    return rows


def q7(evs: list) -> list:
    """Per tumbling window of 10 s, its highest bid (the first of equal ones)."""
    best: dict = {}
    for b in _bids(evs):
        start = b["time"] // 10 * 10
        if start not in best or b["price"] > best[start]["price"]:
            best[start] = b
    return [{"start": float(s), "end": float(s + 10), "auction": b["auction"], "bidder": b["bidder"], "price": b["price"]}
            for s, b in sorted(best.items())]  # fmt: skip


def q8(evs: list) -> list:
    """The people who opened an auction in the 10 s window they registered in, once per window."""
    sellers: dict = defaultdict(set)
    for e in evs:
        if e["kind"] == "auction":
            sellers[e["time"] // 10 * 10].add(e["seller"])
    return [{"id": e["id"], "name": e["name"], "window_start": e["time"] // 10 * 10}
            for e in evs if e["kind"] == "person" and e["id"] in sellers[e["time"] // 10 * 10]]  # fmt: skip


DIRECT: dict[str, Callable[[list], list]] = {"q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8}
assert set(DIRECT) == set(QUERIES)


def direct_results(query: str, evs: list) -> list:
    """The rows of ``query`` over ``evs``, computed directly (order: as a flow releases them, but
    compare as multisets)."""
    return DIRECT[query](evs)
