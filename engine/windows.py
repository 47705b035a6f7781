"""Event-time windows for ``KeyedStream.window``: ``Tumbling(size)``, ``Sliding(size, slide)``
and ``Session(gap)`` (seconds of event time), and what a windowed aggregation emits: ``WindowResult(key, start,
end, value)`` per key and window, ``Late(key, element, event_time)`` to its late sink.

>>> from driftstream.engine.windows import Tumbling, Sliding
>>> Sliding(60, 10).assign(65_000)[:2]        # (start_ms, end_ms) of the windows of 65 s
[(10000, 70000), (20000, 80000)]

See :mod:`driftstream.ordering.windows` for when a window closes and what is late.
"""

from driftstream.ordering.windows import Late, Session, Sliding, Tumbling, WindowResult

__all__ = ["Late", "Session", "Sliding", "Tumbling", "WindowResult"]
