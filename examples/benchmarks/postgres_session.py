"""What a benchmark against PostgreSQL runs in: a server (the one given, else a local one,
stopped at the end) and a Ray session (started here unless one is running, then shut down).

>>> with ray_and_postgres(None) as dsn:          # doctest: +SKIP
...     run(dsn)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional


@contextmanager
def ray_and_postgres(dsn: Optional[str]) -> Iterator[str]:
    """Yields the DSN to use: ``dsn``, or a local server's."""
    import ray

    from driftstream.engine.runtime.ray_session import ensure_ray

    local = None
    if dsn is None:
        from driftstream.engine.connectors.local_postgres import start_local_postgres

        local = start_local_postgres()
    started_ray = ensure_ray()
    try:
        yield dsn or local.dsn
    finally:
        if started_ray:
            ray.shutdown()
        if local is not None:
            local.stop()
