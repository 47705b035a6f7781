"""A paced clickstream that runs for an hour: the flow to try ``driftstream start``, ``list``,
``status --watch``, ``rescale`` and ``stop`` on (a bounded example ends before they show it
running).

    driftstream start driftstream.examples.live_clicks:flow -p 2 --guarantee exactly-once
    driftstream list
    driftstream status live-clicks --watch
    driftstream rescale live-clicks -p 3
    driftstream stop live-clicks
    driftstream start driftstream.examples.live_clicks:flow -p 2 --guarantee exactly-once --resume   # or --fresh

Clicks (:mod:`driftstream.examples.clicks`) arrive at 20 a second; each page's clicks are
counted in 10-second windows of when they happened, one JSON line per page and window
(``[t, {"page", "start", "end", "clicks"}]``) in ``$TMPDIR/driftstream-live-clicks/counts-<partition>.jsonl`` as each window closes (when the
clicks' log time has passed its end: their source time, ``timestamp=logged``).

>>> f = build(clicks_n=40, rate=1000.0, out_dir=None)
>>> counts = f.run(runtime="simulator").output("counts")
>>> sum(c["clicks"] for c in counts) <= 40 and all(c["end"] - c["start"] == 10.0 for c in counts)
True
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from driftstream.engine.connectors.file_sink import FileSink
from driftstream.engine.api.flow import Flow
from driftstream.engine.connectors.memory import MemorySink, PacedSource
from driftstream.engine.windows import Tumbling
from driftstream.examples.clicks import at, clicks, logged

#: where ``flow`` writes its counts
OUT_DIR = os.path.join(tempfile.gettempdir(), "driftstream-live-clicks")


def page(click: dict) -> str:
    return click["page"]


def as_row(window) -> dict:
    """A closed window's count as the JSON line written."""
    return {"page": window.key, "start": window.start, "end": window.end, "clicks": window.value}


def build(clicks_n: int = 72_000, rate: float = 20.0, out_dir: Optional[str] = OUT_DIR) -> Flow:
    """``clicks_n`` clicks at ``rate`` a second (default: an hour), counted per page in 10 s
    windows, into JSON lines in ``out_dir`` (None: a MemorySink, for tests)."""
    f = Flow("live-clicks")
    sink = FileSink(out_dir, "counts") if out_dir else MemorySink("counts")
    (f.source(PacedSource(clicks(clicks_n), rate=rate, partitions=2, timestamp=logged), name="clicks")
      .key_by(page, name="by_page")
      .window(Tumbling(10), timestamp=at, name="per_10s").count()
      .map(as_row, name="row")
      .sink(sink))
    return f


flow = build()
