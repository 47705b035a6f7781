"""Windowed page-view counts: clicks per page every minute (``Tumbling(60)``) and over the
last minute every 10 s (``Sliding(60, 10)``), by the time of the click; a window closes once
the log's time passes its end plus 5 s, and clicks logged later than that go to a sink of
their own, counted.

Run it:  driftstream run driftstream.examples.page_views:flow --parallelism 2

With Kafka (clicks as JSON in a topic, the record timestamp being the click's time):
``kafka_flow("127.0.0.1:9092", "clicks", "page-views")``.

>>> result = build(clicks(300)).run(runtime="simulator")
>>> r = result.output("per_minute")[0]
>>> (r.key in PAGES, r.end - r.start, r.value > 0)
(True, 60.0, True)
"""

from __future__ import annotations

from typing import Optional

from driftstream.engine.model.connectors import Sink, Source
from driftstream.engine import Flow
from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.engine.windows import Sliding, Tumbling

from .clicks import PAGES, at, clicks, logged  # noqa: F401  (PAGES: for the doctest)


def build(source: "Source | list", per_minute: Optional[Sink] = None, last_minute: Optional[Sink] = None,
          late: Optional[Sink] = None, name: str = "page_views", lateness: float = 5.0) -> Flow:
    """The flow over ``source`` (a Source, or a list of clicks for a MemorySource)."""
    flow = Flow(name)
    src = MemorySource(source, partitions=2, timestamp=logged) if isinstance(source, list) else source
    by_page = flow.source(src, name="clicks").key_by(lambda c: c["page"], name="by_page")
    (by_page.window(Tumbling(60), timestamp=at, allowed_lateness=lateness, name="minutes").count()
        .late(late or MemorySink("late")).sink(per_minute or MemorySink("per_minute")))
    (by_page.window(Sliding(60, 10), timestamp=at, allowed_lateness=lateness, name="sliding").count()
        .sink(last_minute or MemorySink("last_minute")))
    return flow


def kafka_flow(bootstrap_servers: str, clicks_topic: str, out_topic: str, name: str = "page_views") -> Flow:
    """Clicks (JSON) from a Kafka topic whose record timestamps are when they were logged; the
    per-minute counts to ``out_topic``, the sliding ones to ``<out_topic>.sliding``, late clicks
    to ``<out_topic>.late``."""
    from driftstream.engine import KafkaSink, KafkaSource

    return build(KafkaSource(clicks_topic, bootstrap_servers), KafkaSink(out_topic, bootstrap_servers),
                 KafkaSink(f"{out_topic}.sliding", bootstrap_servers), KafkaSink(f"{out_topic}.late", bootstrap_servers), name=name)


flow = build(clicks())
