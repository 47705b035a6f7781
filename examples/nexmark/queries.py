"""Nexmark queries q1, q2, q3, q5, q7 and q8 as driftstream flows over the events of
:mod:`.generator` (event time: each event's ``time``, the source time of the stream).

- q1 (currency conversion): every bid with its price in euros (x 0.908).
- q2 (selection): the bids on auctions whose id is a multiple of 123.
- q3 (local item suggestion): auctions of category 10 whose seller lives in OR, ID or CA,
  with the seller's name, city and state. Nexmark's is a regular join; here it is a
  ``lookup`` (the seller as of the auction: people exist before their auctions).
- q5 (hot items): per sliding window of 10 s every 2 s, the auctions with the most bids.
- q7 (highest bid): per tumbling window of 10 s, the highest bid.
- q8 (monitor new users): the people who opened an auction in the same 10 s window as
  they registered (a window join).

>>> from driftstream.examples.nexmark.generator import events
>>> out = build("q7", events(3000, rate=200)).run(runtime="simulator").output("q7")
>>> [(w["start"], w["end"]) for w in out]
[(0.0, 10.0), (10.0, 20.0)]
"""

from __future__ import annotations

from typing import Any, Optional

from driftstream.engine.model.connectors import Sink, Source
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.engine.windows import Sliding, Tumbling, WindowResult

from .generator import event_time

QUERIES = ("q1", "q2", "q3", "q5", "q7", "q8")


def _is(kind: str):
    def check(e: dict) -> bool:
        return e["kind"] == kind

    check.__name__ = f"is_{kind}"
    return check


def q1_euros(bid: dict) -> dict:
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": round(bid["price"] * 0.908), "time": bid["time"]}


def q2_selected(bid: dict) -> bool:
    return bid["auction"] % 123 == 0


def q3_row(pair: tuple) -> Optional[dict]:
    auction, person = pair
    return {"name": person["name"], "city": person["city"], "state": person["state"], "auction": auction["id"]}


def q5_hottest(best: tuple, result: WindowResult) -> tuple:
    """Fold of a window's per-auction counts: (the highest count, the auctions with it)."""
    count, auctions = best
    if result.value > count:
        return result.value, (result.key,)
    if result.value == count:
        return count, tuple(sorted(auctions + (result.key,)))
    return best


def q5_row(result: WindowResult) -> dict:
    count, auctions = result.value
    return {"start": round(result.start + 2 - 10, 3), "end": result.start + 2, "bids": count, "auctions": list(auctions)}


def q7_higher(a: dict, b: dict) -> dict:
    return b if b["price"] > a["price"] else a


def q7_row(result: WindowResult) -> dict:
    bid = result.value
    return {"start": result.start, "end": result.end, "auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"]}


def q8_once(last_window: Any, pair: tuple) -> tuple:
    """A person once per window, however many auctions they opened in it."""
    person = pair[1]
    window = person["time"] // 10 * 10
    if last_window == window:
        return last_window, None
    return window, {"id": person["id"], "name": person["name"], "window_start": window}


def build(query: str, source: "Source | list", sink: Optional[Sink] = None, name: Optional[str] = None) -> Flow:
    """The flow of ``query`` over ``source`` (a Source of events, or a list of them for a
    two-partition MemorySource timed by each event's ``time``); results to ``sink`` (default:
    a MemorySink named after the query)."""
    if query not in QUERIES:
        raise ValueError(f"unknown Nexmark query {query!r}; the queries: {', '.join(QUERIES)}")
    flow = Flow(name or f"nexmark-{query}")
    src = MemorySource(source, partitions=2, timestamp=event_time) if isinstance(source, list) else source
    events = flow.source(src, name="events")
    out = sink or MemorySink(query)
    bids = events.filter(_is("bid"), name="bids")
    if query == "q1":
        bids.map(q1_euros, name="euros").sink(out)
    elif query == "q2":
        bids.filter(q2_selected, name="selected").map(lambda b: {"auction": b["auction"], "price": b["price"]}, name="row").sink(out)
    elif query == "q3":
        people = (events.filter(_is("person"), name="people").filter(lambda p: p["state"] in ("OR", "ID", "CA"), name="local")
                  .key_by(lambda p: p["id"], name="person_id"))
        auctions = (events.filter(_is("auction"), name="auctions").filter(lambda a: a["category"] == 10, name="category_10")
                    .key_by(lambda a: a["seller"], name="seller"))
        auctions.lookup(people, name="with_seller").filter(lambda pair: pair[1] is not None, name="local_sellers").map(q3_row, name="row").sink(out)
    elif query == "q5":
        counts = bids.key_by(lambda b: b["auction"], name="auction").window(Sliding(10, 2), name="per_auction").count()
        # Each count leaves at its window's end (its source time): windows of 2 s just before
        # it, closed 1 s later, gather the counts of one sliding window.
        (counts.key_by(lambda r: r.end, name="window_end")
         .window(Tumbling(2), timestamp=lambda r: r.end - 0.001, allowed_lateness=1.0, name="hottest").fold((0, ()), q5_hottest)
         .map(q5_row, name="row").sink(out))
    elif query == "q7":
        (bids.key_by(lambda b: 0, name="all").window(Tumbling(10), name="per_10s").reduce(q7_higher)
         .map(q7_row, name="row").sink(out))
    else:  # q8
        people = events.filter(_is("person"), name="people").key_by(lambda p: p["id"], name="person_id")
        auctions = events.filter(_is("auction"), name="auctions").key_by(lambda a: a["seller"], name="seller")
        (people.join(auctions, window=Tumbling(10), name="same_window").key_by(lambda pair: pair[0], name="new_user")
         .stateful_map(q8_once, name="once").sink(out))
    return flow
