"""The measuring consumer of the inverted-index benchmarks, against a real broker (Tansu)
and as the subprocess the benchmarks start: it counts records while they come and hands
every one back after it stops, stamped with the time its fetch answered."""

from __future__ import annotations

import json
import time
import uuid

from driftstream.engine.connectors.kafka.io import ensure_topic
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from driftstream.examples.inverted_index.measure import OutputMeter


def test_the_meter_counts_records_as_they_come_and_hands_back_each_once_in_order(kafka_broker):
    bs = kafka_broker.bootstrap_servers
    topic = f"meter-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, topic, 2)
    writers = [PartitionWriter(bs, topic, p) for p in (0, 1)]
    meter = OutputMeter(bs, topic).start()
    try:
        sent_before = time.time() * 1000.0
        for round_ in range(3):  # several fetches per partition, so answers are kept apart
            for p, w in enumerate(writers):
                w.write([(json.dumps({"page_id": p, "n": round_ * 100 + i}).encode(), []) for i in range(100)])
            time.sleep(0.1)
        assert meter.wait_for(600, timeout=30), f"counted {meter.count} of 600"
        time.sleep(0.2)
        assert meter.count == 600  # nothing counted twice
    finally:
        arrivals = meter.stop()
        for w in writers:
            w.close()
    assert len(arrivals) == 600
    assert all(stamp >= sent_before for stamp, _ in arrivals)
    for p in (0, 1):
        got = [(stamp, r["n"]) for stamp, r in arrivals if r["page_id"] == p]
        assert [n for _, n in got] == list(range(300))  # each record once, in offset order
        assert [s for s, _ in got] == sorted(s for s, _ in got)  # stamped when its answer came
