"""The paced feeder: publishes the corpus send sequence to Kafka at a given rate with Poisson arrivals.

Reads the Parquet with pyarrow (no Spark) and publishes the rows in ``seq`` order,
one Kafka record per row (compact JSON ``{"page_id", "title", "text",
"sent_at_ms"}``, key = the page id). Inter-arrival gaps are exponential with mean
``1 / rate`` from a seeded RNG, and each send is scheduled at an absolute time
(start + the sum of the gaps so far), so the feed does not drift when a send is
late: it catches up. ``sent_at_ms`` (``time.time() * 1000``) is stamped right
before the record is handed to the producer (``linger_ms=0``, ``acks=1``, one
request in flight, so the topic keeps the seq order).

``sends`` records every send (seq, page_id, version, sent_at_ms, n_changes);
``n_changes`` is the number of change records the send produces
(:func:`documents.page_changes` of the page's previous version and this one), so a
latency-measuring consumer knows when a document's last change record arrived.

>>> from driftstream.examples.inverted_index.feeder import arrival_offsets
>>> offs = arrival_offsets(20_000, rate=100.0, seed=1)
>>> round(offs[-1] / 200.0, 1)   # 20000 docs at 100 docs/s: ~200 s
1.0
>>> offs == sorted(offs) and offs == arrival_offsets(20_000, 100.0, seed=1)
True

CLI::

    python -m driftstream.examples.inverted_index.feeder --parquet P --bootstrap B --topic T --rate 500 [--seed S] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Union

import pyarrow as pa

from .documents import page_changes, word_positions


@dataclass
class Send:
    """One published record: its place in the sequence, when it was handed to the producer, how many change records it makes."""

    seq: int
    page_id: int
    version: int
    sent_at_ms: float
    n_changes: int


def create_topic(bootstrap_servers: str, topic: str, partitions: int = 1) -> int:
    """Create ``topic`` unless it exists (idempotent); returns its partition count."""
    from driftstream.engine.connectors.kafka.io import ensure_topic

    return ensure_topic(bootstrap_servers, topic, partitions)


def arrival_offsets(n: int, rate: float, seed: int = 0) -> list:
    """Seconds after the start at which the ``n`` sends are due: a Poisson process of ``rate`` per second.

    ``rate`` = inf: all at 0 (as fast as possible).
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 docs/s, got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


class Feeder:
    """Publishes a corpus (a Parquet path or a pyarrow Table) to ``topic`` at ``rate`` docs/s.

    ``run()`` blocks until everything is sent (or ``stop()``); ``start()`` runs it in a
    background thread and ``join()`` waits for it (re-raising its error, if any).
    """

    def __init__(
        self,
        parquet_path_or_table: Union[str, pa.Table],
        bootstrap_servers: str,
        topic: str,
        rate: float,
        seed: int = 0,
        limit: Optional[int] = None,
    ) -> None:
        if isinstance(parquet_path_or_table, pa.Table):
            table = parquet_path_or_table.sort_by("seq")
        else:
            from .corpus import read_corpus

            table = read_corpus(str(parquet_path_or_table))
        if limit is not None:
            table = table.slice(0, limit)
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.rate = float(rate)
        self.seed = seed
        cols = {c: table.column(c).to_pylist() for c in ("seq", "page_id", "title", "text")}
        versions = table.column("version").to_pylist() if "version" in table.column_names else None
        remaining = Counter(cols["page_id"])  # sends left per page: keep a page's words only while it has more
        previous: dict = {}
        # (seq, page_id, version, n_changes, the record's JSON up to sent_at_ms, key)
        self._plan: list = []
        seen: dict = {}
        for i, (seq, page_id, title, text) in enumerate(zip(cols["seq"], cols["page_id"], cols["title"], cols["text"])):
            new = word_positions(text)
            n_changes = len(page_changes(previous.pop(page_id, None), new))
            remaining[page_id] -= 1
            if remaining[page_id]:
                previous[page_id] = new
            version = versions[i] if versions is not None else seen.get(page_id, -1) + 1
            seen[page_id] = version
            head = json.dumps({"page_id": page_id, "title": title, "text": text}, ensure_ascii=False, separators=(",", ":"))
            self._plan.append((seq, page_id, version, n_changes, head[:-1].encode("utf-8") + b',"sent_at_ms":', str(page_id).encode()))
        self._offsets = arrival_offsets(len(self._plan), self.rate, seed)
        self.sends: list[Send] = []
        self.started_at: Optional[float] = None
        self.finished_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def __len__(self) -> int:
        return len(self._plan)

    @property
    def expected_n_changes(self) -> list:
        """Per planned send (in order): the number of change records it produces."""
        return [p[3] for p in self._plan]

    def _producer(self):
        from kafka import KafkaProducer

        return KafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            acks=1,
            linger_ms=0,
            enable_idempotence=False,
            max_in_flight_requests_per_connection=1,
            max_request_size=4 * 1024 * 1024,
        )

    def run(self) -> list:
        """Publish every planned send at its due time; returns ``sends``."""
        create_topic(self.bootstrap_servers, self.topic, 1)
        producer = self._producer()
        errors: list = []
        try:
            producer.partitions_for(self.topic)  # fetch the metadata now, not on the first timed send
            send, topic, wait, stopped = producer.send, self.topic, self._stop.wait, self._stop.is_set
            self.started_at = time.time()
            t0 = time.monotonic()
            for (seq, page_id, version, n_changes, head, key), offset in zip(self._plan, self._offsets):
                delay = t0 + offset - time.monotonic()
                if delay > 0 and wait(delay):
                    break
                if stopped():
                    break
                sent_at_ms = time.time() * 1000.0
                send(topic, value=head + repr(sent_at_ms).encode() + b"}", key=key).add_errback(errors.append)
                self.sends.append(Send(seq, page_id, version, sent_at_ms, n_changes))
            producer.flush()
            self.finished_at = time.time()
        finally:
            producer.close()
        if errors:
            raise RuntimeError(f"{len(errors)} of {len(self.sends)} records were not delivered to {self.topic}: {errors[0]!r}")
        return self.sends

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except BaseException as e:  # re-raised by join()
            self._error = e

    def start(self) -> "Feeder":
        """Run in a background (daemon) thread."""
        if self._thread is not None:
            raise RuntimeError("the feeder was already started")
        self._thread = threading.Thread(target=self._run_in_thread, name=f"feeder-{self.topic}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending (what was sent stays in ``sends``)."""
        self._stop.set()

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait for the background run; True when it ended. Re-raises its error."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return not self._thread.is_alive()

    @property
    def achieved_rate(self) -> Optional[float]:
        """Sends per second between the start and the last send."""
        if len(self.sends) < 2 or self.started_at is None:
            return None
        span = (self.sends[-1].sent_at_ms / 1000.0) - self.started_at
        return len(self.sends) / span if span > 0 else None


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.feeder", description="Publish a corpus Parquet at a rate with Poisson arrivals.")
    p.add_argument("--parquet", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, required=True, help="docs/s (inf: as fast as possible)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)
    feeder = Feeder(args.parquet, args.bootstrap, args.topic, args.rate, seed=args.seed, limit=args.limit)
    try:
        feeder.run()
    except KeyboardInterrupt:
        feeder.stop()
    print(f"sent {len(feeder.sends)} of {len(feeder)} docs to {args.topic} at {feeder.achieved_rate or 0:.1f} docs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
