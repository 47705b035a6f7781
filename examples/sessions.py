"""Sessionization: each user's clicks less than 30 s apart make a session; when it closes
(the log's time 30 s past its last click, plus 5 s of lateness), one record with its user,
start, length in seconds and pages.

Run it:  driftstream run driftstream.examples.sessions:flow --parallelism 2

>>> s = build(clicks(300)).run(runtime="simulator").output("sessions")[0]
>>> sorted(s), s["clicks"] >= 1 and s["seconds"] >= 0
(['clicks', 'pages', 'seconds', 'start', 'user'], True)
"""

from __future__ import annotations

from typing import Optional

from driftstream.engine.model.connectors import Sink, Source
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.engine.windows import Session, WindowResult

from .clicks import at, clicks, logged


def summary(result: WindowResult) -> dict:
    """One session: its user, start (s), length (s, first to last click), clicks and distinct pages."""
    times = [c["at"] for c in result.value]
    return {"user": result.key, "start": result.start, "seconds": round(max(times) - min(times), 3),
            "clicks": len(result.value), "pages": sorted({c["page"] for c in result.value})}


def build(source: "Source | list", sink: Optional[Sink] = None, late: Optional[Sink] = None, name: str = "sessions",
          gap: float = 30.0) -> Flow:
    """The flow over ``source`` (a Source, or a list of clicks for a MemorySource timed by ``logged``)."""
    flow = Flow(name)
    src = MemorySource(source, partitions=2, timestamp=logged) if isinstance(source, list) else source
    (flow.source(src, name="clicks").key_by(lambda c: c["user"], name="by_user")
        .window(Session(gap), timestamp=at, allowed_lateness=5.0, name="session").collect()
        .late(late or MemorySink("late")).map(summary, name="summary").sink(sink or MemorySink("sessions")))
    return flow


flow = build(clicks())
