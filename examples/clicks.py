"""A synthetic clickstream for the window and session examples: ``{"user", "page", "at",
"logged"}``: ``at`` is when the user clicked (event time), ``logged`` when the click reached
the log (the source time, as a Kafka record's timestamp), both in seconds.

Clicks reach the log a little out of order, as they do from many servers: up to
``disorder`` seconds after they happened, and a few (``late_every``) ten minutes after.

>>> c = clicks(5, seed=2)
>>> sorted(c[0]), len(c), all(x["logged"] >= x["at"] for x in c)
(['at', 'logged', 'page', 'user'], 5, True)
"""

from __future__ import annotations

import random

PAGES = ("home", "search", "product", "cart", "checkout", "help")


def clicks(n: int = 5000, users: int = 50, seconds_per_click: float = 0.5, disorder: float = 3.0,
           late_every: int = 97, seed: int = 1) -> list:
    """``n`` clicks of ``users`` users over ``n * seconds_per_click`` seconds, in arrival order.

    A user clicks in bursts (sessions), a few seconds apart, with pauses of a minute or more
    between bursts."""
    rng = random.Random(seed)
    next_at = {u: rng.uniform(0, 60) for u in range(users)}
    out = []
    for i in range(n):
        user = rng.randrange(users)
        at = next_at[user]
        next_at[user] = at + (rng.uniform(60, 180) if rng.random() < 0.15 else rng.uniform(1, 10))
        out.append({"user": f"u{user}", "page": rng.choice(PAGES), "at": round(at, 3)})
    # arrival order: by event time plus a random delay; every late_every-th click comes much later
    for i, click in enumerate(out):
        click["logged"] = round(click["at"] + rng.uniform(0, disorder) + (600.0 if late_every and i % late_every == 0 else 0.0), 3)
    return sorted(out, key=logged)


def at(click: dict) -> float:
    """A click's event time, seconds."""
    return click["at"]


def logged(click: dict) -> float:
    """When a click reached the log: its source time, seconds."""
    return click["logged"]
