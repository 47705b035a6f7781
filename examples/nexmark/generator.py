"""The Nexmark event generator, written from the specification (Tucker et al., "NEXMark - A
Benchmark for Queries over Data Streams", and the generator that Beam and Flink's Nexmark
suites share): out of every 50 events, 1 new person, 3 new auctions and 46 bids.

Event ``i`` is a function of ``i`` and the seed alone (its own random generator), so any
prefix, partition or replay of the stream is the same events. Event times rise by
``1 / rate`` seconds per event from 0; ids start at 1000 so that small runs find matches.

- A person: ``id, name, email, credit_card, city, state, time``.
- An auction: ``id, item, initial_bid, reserve, time, expires, seller, category``; the
  seller is a recent person (one in ``HOT_SELLER_RATIO`` a "hot" one), the category one of
  ``NUM_CATEGORIES`` from 10.
- A bid: ``auction, bidder, price, channel, time``; the auction and bidder are recent
  ones, hot ones with the spec's ratios. Prices are in cents, log-uniform from 1 to $1M.

>>> es = events(100)
>>> [e["kind"] for e in es[:5]], es[0]["id"], es[1]["seller"] >= 1000
(['person', 'auction', 'auction', 'auction', 'bid'], 1000, True)
>>> events(60)[57] == events(100)[57]              # a prefix is the same events
True
"""

from __future__ import annotations

import random

PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID, NUM_CATEGORIES = 10, 5
#: New people (auctions) a bid or auction may refer to ahead of the last one created.
PERSON_ID_LEAD = AUCTION_ID_LEAD = 10
#: One in this many auctions, bidders and sellers is a "hot" one.
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
#: People and auctions active at once (a bid's auction is one of the last this many).
NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS = 1000, 100

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")


def _counts(i: int) -> tuple:
    """(people, auctions) created before event i, and event i's kind."""
    epoch, offset = divmod(i, PROPORTION_DENOMINATOR)
    people = epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION)
    auctions = epoch * AUCTION_PROPORTION + max(0, min(offset - PERSON_PROPORTION, AUCTION_PROPORTION))
    kind = "person" if offset < PERSON_PROPORTION else "auction" if offset < PERSON_PROPORTION + AUCTION_PROPORTION else "bid"
    return people, auctions, kind


def _recent(rng: random.Random, created: int, active: int, lead: int) -> int:
    """A base-0 id among the last ``active`` created, or up to ``lead`` ahead."""
    return max(0, created - 1 - rng.randrange(min(active, max(created, 1)))) if created else rng.randrange(lead)


def event(i: int, rate: float = 1000.0, seed: int = 0) -> dict:
    """Event ``i`` (0-based) of the stream: a dict with ``kind`` and ``time`` (seconds)."""
    rng = random.Random(seed * 1_000_003 + i)
    people, auctions, kind = _counts(i)
    time_s = round(i / rate, 6)
    if kind == "person":
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        return {"kind": "person", "id": FIRST_PERSON_ID + people, "name": f"{first} {last}",
                "email": f"{first.lower()}@{last.lower()}.com", "credit_card": "%016d" % rng.randrange(10**16),
                "city": rng.choice(US_CITIES), "state": rng.choice(US_STATES), "time": time_s}
    if kind == "auction":
        seller = _recent(rng, people, NUM_ACTIVE_PEOPLE, PERSON_ID_LEAD)
        if rng.randrange(HOT_SELLER_RATIO) == 0:
            seller = (seller // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        initial = _price(rng)
        return {"kind": "auction", "id": FIRST_AUCTION_ID + auctions, "item": f"item-{auctions}", "initial_bid": initial,
                "reserve": initial + _price(rng), "time": time_s, "expires": round(time_s + rng.uniform(1, 60), 6),
                "seller": FIRST_PERSON_ID + seller, "category": FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES)}
    auction = _recent(rng, auctions, NUM_IN_FLIGHT_AUCTIONS, AUCTION_ID_LEAD)
    if rng.randrange(HOT_AUCTION_RATIO) == 0:
        auction = (auction // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    bidder = _recent(rng, people, NUM_ACTIVE_PEOPLE, PERSON_ID_LEAD)
    if rng.randrange(HOT_BIDDER_RATIO) == 0:
        bidder = (bidder // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    return {"kind": "bid", "auction": FIRST_AUCTION_ID + auction, "bidder": FIRST_PERSON_ID + bidder,
            "price": _price(rng), "channel": rng.choice(CHANNELS), "time": time_s}


def _price(rng: random.Random) -> int:
    """Cents, log-uniform from $1 to $1M."""
    return round(10 ** (rng.random() * 6) * 100)


def events(n: int, rate: float = 1000.0, seed: int = 0) -> list:
    """The first ``n`` events, in event-time order."""
    return [event(i, rate, seed) for i in range(n)]


def event_time(e: dict) -> float:
    """An event's time, seconds: what the queries' windows use (and a Kafka record's timestamp)."""
    return e["time"]
