"""The kafka-python helpers against a real broker (Tansu): a partition's last record is
found without waiting for empty reads, whole batches included, however slowly the broker
answers, past a transaction's marker; and a consumer that found it reads on from anywhere."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import TopicPartition

from driftstream.engine.connectors.kafka.io import LastRecordTimeout, consumer, ensure_topic, last_record, read_partition, true_end
from driftstream.engine.connectors.kafka.wire import PartitionWriter
from tests.engine.connectors.kafka.slow_broker import slow_broker
from tests.engine.connectors.kafka.test_librdkafka import write_transactions


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


def test_a_slow_broker_is_not_an_empty_partition():
    """Fetch answers 1.2 s and 3 s late (a real broker behind a delaying proxy): the last
    record still, however long it takes; past the deadline an error that says where and why,
    never None (which a sink would take for "nothing written" and write everything again)."""
    with slow_broker() as (broker, proxy):
        bs, topic = broker.bootstrap_servers, f"slow-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, 1)
        tp = TopicPartition(topic, 0)
        writer = PartitionWriter(bs, topic, 0)
        writer.write([(b"a%d" % i, []) for i in range(300)])
        writer.write([(b"b%d" % i, []) for i in range(7)])
        writer.close()
        for delay in (1.2, 3.0):
            proxy.delay_s = delay
            c = consumer(bs)
            try:
                began = time.monotonic()
                rec = last_record(c, tp)
                assert (rec.offset, rec.value) == (306, b"b6")
                assert time.monotonic() - began >= delay  # it did wait for the answer
            finally:
                c.close()
        c = consumer(bs)
        try:
            began = time.monotonic()
            with pytest.raises(LastRecordTimeout) as err:
                last_record(c, tp, timeout_s=1.5)
            assert 1.5 <= time.monotonic() - began < 10.0
        finally:
            c.close()
        text = str(err.value)
        assert f"{topic}[0]" in text and bs in text and "1.5 s" in text and "no fetch answer came" in text
        assert "check that the broker is up and answers fetches" in text


def test_a_partition_that_ends_in_a_transaction_marker_gives_its_last_data_record(kafka_broker):
    """The last offset of a transactional writer's partition is its commit marker, a control
    batch no consumer returns: the last record is read further back, not taken for None."""
    bs, topic = kafka_broker.bootstrap_servers, f"io-txn-{uuid.uuid4().hex[:8]}"
    ensure_topic(bs, topic, 1)
    write_transactions(bs, topic, [(True, [(0, b"a%d" % i) for i in range(40)]), (True, [(0, b"b%d" % i) for i in range(3)])])
    tp = TopicPartition(topic, 0)
    c = consumer(bs)
    try:
        rec = last_record(c, tp, timeout_s=10.0)
        assert rec is not None and rec.value == b"b2"
        assert true_end(c, tp, timeout_s=10.0) == rec.offset + 1  # the marker after it is no record
    finally:
        c.close()
