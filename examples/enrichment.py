"""Enrichment: orders joined with a changing customer table (``lookup``: each order with the
customer's record as it was at the order's position in the stream, whatever the arrival
order), and orders joined with their payments within 10 minutes (an interval join; an
order with no payment in time leaves as unpaid).

Run it:  driftstream run driftstream.examples.enrichment:flow --parallelism 2

>>> result = build(events(200)).run(runtime="simulator")
>>> order, customer = result.output("orders_with_customer")[0]
>>> order["kind"], customer is None or customer["id"] == order["customer"]
('order', True)
"""

from __future__ import annotations

import random
from typing import Optional

from driftstream.engine.model.connectors import Sink, Source
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource


def events(n: int = 3000, customers: int = 40, seed: int = 1) -> list:
    """``n`` events in log order, one every 2 s: customer updates (a new tier), orders, and the
    payments of most orders, 1 s to 15 min after them."""
    rng = random.Random(seed)
    out, order_id = [], 0
    for i in range(n):
        now, c = i * 2.0, rng.randrange(customers)
        if rng.random() < 0.2:
            out.append({"kind": "customer", "id": c, "tier": rng.choice(["bronze", "silver", "gold"]), "at": now})
        else:
            order_id += 1
            out.append({"kind": "order", "id": order_id, "customer": c, "amount": rng.randrange(5, 500), "at": now})
            if rng.random() < 0.9:
                out.append({"kind": "payment", "order": order_id, "at": now + rng.uniform(1, 900)})
    return sorted(out, key=lambda e: e["at"])


def at(event: dict) -> float:
    return event["at"]


def _paid(pair: tuple) -> dict:
    order, payment = pair[1], pair[2]
    return {"order": order["id"], "paid": payment is not None, "after_s": None if payment is None else round(payment["at"] - order["at"], 3)}


def build(source: "Source | list", with_customer: Optional[Sink] = None, payments: Optional[Sink] = None,
          name: str = "enrichment") -> Flow:
    """The flow over ``source`` (a Source, or a list of events for a MemorySource timed by ``at``)."""
    flow = Flow(name)
    src = MemorySource(source, partitions=2, timestamp=at) if isinstance(source, list) else source
    events_ = flow.source(src, name="events")
    orders = events_.filter(lambda e: e["kind"] == "order", name="is_order")
    customers = events_.filter(lambda e: e["kind"] == "customer", name="is_customer").key_by(lambda e: e["id"], name="customer_id")
    orders.key_by(lambda o: o["customer"], name="order_customer").lookup(customers, name="with_customer").sink(
        with_customer or MemorySink("orders_with_customer"))
    paid = events_.filter(lambda e: e["kind"] == "payment", name="is_payment").key_by(lambda p: p["order"], name="payment_order")
    (orders.key_by(lambda o: o["id"], name="order_id").join(paid, interval=(0, 600), how="left", name="paid_in_time")
        .map(_paid, name="paid").sink(payments or MemorySink("payments")))
    return flow


flow = build(events())
