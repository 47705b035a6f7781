"""The kafka-python helpers against a real broker (Tansu): a partition's last record is
found without waiting for empty reads, whole batches included, and a consumer that found
it reads on from anywhere."""

from __future__ import annotations

import time
import uuid

from kafka import TopicPartition

from driftstream.engine.connectors.kafka.io import consumer, ensure_topic, last_record, read_partition, true_end
from driftstream.engine.connectors.kafka.wire import PartitionWriter


def test_the_last_record_is_the_last_of_the_last_batch_however_large(kafka_broker):
    bs, topic = kafka_broker.bootstrap_servers, f"io-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, topic, 1)
    tp = TopicPartition(topic, 0)
    c = consumer(bs)
    try:
        assert last_record(c, tp) is None and true_end(c, tp) == 0
        writer = PartitionWriter(bs, topic, 0)
        # Batches larger than a poll returns (max_poll_records, 500): Tansu reports the end as
        # the last batch's base offset + 1.
        writer.write([(b"a%d" % i, []) for i in range(1200)])
        writer.write([(b"b%d" % i, []) for i in range(1700)])
        writer.close()
        rec = last_record(c, tp)
        assert (rec.offset, rec.value) == (2899, b"b1699")
        assert true_end(c, tp) == 2900
        # The same consumer reads on from an earlier offset at once (no long poll left in the way).
        began = time.monotonic()
        assert [r.offset for r in read_partition(c, tp, 1000, max_s=10.0)] == list(range(1000, 2900))
        assert time.monotonic() - began < 5.0
    finally:
        c.close()
