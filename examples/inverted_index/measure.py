"""The measuring consumer: reads the output topic and times each document's last change record.

It runs in its own process (:class:`OutputMeter`), so neither engine's driver nor
the feeder shares its interpreter lock: an arrival is stamped the moment a poll
returns it, before any parsing. Latency of a send = arrival of its last change
record - its ``sent_at_ms``. Records are parsed and matched only after the run
(:func:`document_latencies`): per page, change records arrive in send order, so
the k-th send of a page owns the next ``n_changes`` records of that page.

>>> from driftstream.examples.inverted_index.feeder import Send
>>> sends = [Send(0, 7, 0, 1000.0, 2), Send(1, 8, 0, 1010.0, 1)]
>>> arrivals = [(1003.0, {"page_id": 7}), (1012.0, {"page_id": 8}), (1015.0, {"page_id": 7})]
>>> [(d.seq, d.latency_ms) for d in document_latencies(sends, arrivals).documents]
[(0, 15.0), (1, 2.0)]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable, Optional

from driftstream.engine.model.result import percentiles


@dataclass
class DocumentLatency:
    seq: int
    page_id: int
    sent_at_ms: float
    latency_ms: float


@dataclass
class Latencies:
    """Per-send latencies, plus what did not match: records beyond every send (duplicates)
    and sends whose records did not all arrive (losses)."""

    documents: list = field(default_factory=list)
    duplicates: int = 0
    incomplete: int = 0

    def summary(self, skip: int = 200) -> dict:
        """p50/p75/p95/p99/max/count in ms over the sends after the first ``skip``."""
        return percentiles([d.latency_ms for d in self.documents if d.seq >= skip])


def document_latencies(sends: Iterable, arrivals: Iterable[tuple]) -> Latencies:
    """Match ``arrivals`` ``(recv_ms, record)`` to ``sends`` (feeder ``Send``s) page by page."""
    per_page: dict = defaultdict(deque)
    for s in sorted(sends, key=lambda s: s.seq):
        if s.n_changes > 0:
            per_page[s.page_id].append([s, 0])
    out = Latencies()
    for recv_ms, record in arrivals:
        queue = per_page.get(record["page_id"])
        if not queue:
            out.duplicates += 1
            continue
        entry = queue[0]
        entry[1] += 1
        if entry[1] == entry[0].n_changes:
            s = queue.popleft()[0]
            out.documents.append(DocumentLatency(s.seq, s.page_id, s.sent_at_ms, recv_ms - s.sent_at_ms))
    out.incomplete = sum(len(q) for q in per_page.values())
    out.documents.sort(key=lambda d: d.seq)
    return out


class OutputMeter:
    """A consumer process that stamps every record of ``topic`` (all partitions, from the start).

    >>> meter = OutputMeter(bootstrap, "out").start()          # doctest: +SKIP
    >>> meter.wait_for(expected_records, timeout=60)            # doctest: +SKIP
    >>> arrivals = meter.stop()       # [(recv_ms, record dict)] in arrival order  # doctest: +SKIP

    A plain subprocess (``python -m ...measure``), not multiprocessing: spawning would
    re-run the caller's main module in the child.
    """

    def __init__(self, bootstrap_servers: str, topic: str, python: str = sys.executable) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        fd, self._path = tempfile.mkstemp(prefix="driftstream-meter-", suffix=".tsv")
        os.close(fd)
        self._cmd = [python, "-m", "driftstream.examples.inverted_index.measure", bootstrap_servers, topic, self._path]
        self._process: Optional[subprocess.Popen] = None
        self._count = 0
        self._ready = threading.Event()

    def start(self, timeout: float = 60.0) -> "OutputMeter":
        self._process = subprocess.Popen(self._cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._follow, daemon=True, name="meter-progress").start()
        if not self._ready.wait(timeout):
            self._process.kill()
            raise TimeoutError(f"the measuring consumer did not connect to {self.bootstrap_servers} within {timeout} s")
        return self

    def _follow(self) -> None:
        for line in self._process.stdout:
            if line.startswith("READY"):
                self._ready.set()
            elif line.startswith("COUNT "):
                self._count = int(line[6:])

    @property
    def count(self) -> int:
        """Records received so far (updated every 50 ms)."""
        return self._count

    def wait_for(self, records: int, timeout: float) -> bool:
        """Wait until ``records`` records arrived (True) or ``timeout`` passed (False)."""
        deadline = time.time() + timeout
        while self._count < records:
            if time.time() > deadline or self._process.poll() is not None:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> list:
        """Stop the process; every ``(recv_ms, record)`` it received, in arrival order."""
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(300)  # it decodes what it kept (1.3M records: seconds)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        arrivals = []
        with open(self._path, "rb") as f:
            for line in f:
                recv, _, value = line.rstrip(b"\n").partition(b"\t")
                arrivals.append((float(recv), json.loads(value)))
        os.unlink(self._path)
        return arrivals


def consume(bootstrap_servers: str, topic: str, path: str) -> None:
    """The consumer process: prints READY, then COUNT n every 50 ms; writes
    ``recv_ms<TAB>value`` lines to ``path`` when it gets SIGTERM.

    It fetches on a socket of its own (:class:`.TopicFetcher`): a KafkaConsumer cost
    this process a third of a core, which the engines measured would have shared on
    a small machine. While the run lasts it reads batch headers only (offsets, for the
    count and for holes) and keeps each answer's bytes with its arrival time; records
    are decoded after SIGTERM. Decoding them as they came took a quarter of a core
    during the inverted index's backlog (500k records), taken from the engine under
    test on 2 cores, while Spark's figures come from its own batch ends."""
    from kafka import TopicPartition

    from driftstream.engine.connectors.kafka.io import consumer
    from driftstream.engine.connectors.kafka.offset_gaps import OffsetGaps
    from driftstream.engine.connectors.kafka.wire import TopicFetcher, batches_from

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    c = consumer(bootstrap_servers)
    try:
        partitions = None
        while not partitions and not stop.is_set():
            partitions = c.partitions_for_topic(topic)
            if not partitions:
                time.sleep(0.05)
        tps = [TopicPartition(topic, p) for p in sorted(partitions or ())]
        starts = c.beginning_offsets(tps) if tps else {}
    finally:
        c.close()
    got: list = []  # (recv_ms, fetched at offset, admitted up to offset, the answer's bytes)
    if tps:
        offsets = {tp.partition: starts[tp] for tp in tps}
        # A partition with several writers (Spark's tasks) can show a hole while a batch is stored.
        gaps = {p: OffsetGaps(o, 5.0, name=f"{topic}[{p}]") for p, o in offsets.items()}
        fetcher = TopicFetcher(bootstrap_servers, topic, sorted(offsets), max_wait_ms=5, client_id="driftstream-meter")
        print("READY", flush=True)
        reported, count = time.time(), 0
        while not stop.is_set():
            for p, answer in fetcher.fetch_answers(offsets, decode=False).items():
                now = time.time() * 1000.0
                batches = gaps[p].admit(answer.batches, time.monotonic())
                if batches:
                    got.append((now, offsets[p], gaps[p].next_offset, answer.data))
                    count += sum(b.next_offset - b.offset for b in batches if b.marker is None)
                offsets[p] = gaps[p].next_offset
            if time.time() - reported > 0.05:
                print(f"COUNT {count}", flush=True)
                reported = time.time()
        fetcher.close()
    with open(path, "wb") as f:
        for now, start, end, data in got:
            for b in batches_from(data, start, where=topic):
                for r in b.records:
                    if r.offset < end:
                        f.write(b"%.3f\t%s\n" % (now, r.value))


if __name__ == "__main__":
    consume(*sys.argv[1:4])
