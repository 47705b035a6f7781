"""read_committed, pure logic: which records of fetch answers a reader delivers.

A simulated log of transactional and plain batches from several producers, answers cut
anywhere, with the aborted-transaction list a Kafka broker sends or without one (Tansu,
librdkafka's mock cluster): from any start offset the reader delivers exactly the records
of committed transactions and plain batches below the last stable offset, in offset order.
Then recorded fetch answers, encoded and decoded with kafka-python's protocol classes as a
broker's would be, with batches, markers and aborted-transaction lists built byte for byte.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.record.default_records import DefaultRecordBase
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.record.util import calc_crc32c

from driftstream.engine.connectors.kafka.transactions import Batch, CommittedFilter
from driftstream.engine.connectors.kafka.wire import partition_answer


# -- a simulated log -----------------------------------------------------------------------

@st.composite
def transactional_logs(draw) -> SimpleNamespace:
    """Batches from up to 3 transactional producers and plain ones; some transactions left
    open at the end. ``lso``: the first offset of the oldest open transaction (or the end)."""
    batches: list = []
    open_since: dict = {}  # producer -> first offset of its open transaction
    offset = 0

    def end(pid: int, commit: bool) -> None:
        nonlocal offset
        batches.append(Batch(offset, offset + 1, pid, True, commit))
        del open_since[pid]
        offset += 1

    for _ in range(draw(st.integers(1, 40))):
        kind, pid = draw(st.sampled_from(["plain", "txn", "txn", "end"])), draw(st.integers(1, 3))
        if kind == "end":
            if pid in open_since:
                end(pid, draw(st.booleans()))
            continue
        n = draw(st.integers(1, 3))
        records = tuple(SimpleNamespace(offset=o) for o in range(offset, offset + n))
        if kind == "txn":
            open_since.setdefault(pid, offset)
            batches.append(Batch(offset, offset + n, pid, True, None, records))
        else:
            batches.append(Batch(offset, offset + n, -1, False, None, records))
        offset += n
    for pid in sorted(open_since):
        if draw(st.booleans()):
            end(pid, draw(st.booleans()))
    return SimpleNamespace(batches=batches, lso=min(open_since.values(), default=offset))


def committed_offsets(log: SimpleNamespace, start: int) -> list:
    """The reference: plain records and those of committed transactions, from ``start`` to the LSO."""
    out = []
    for i, b in enumerate(log.batches):
        if b.marker is not None or b.offset >= log.lso:
            continue
        if b.transactional:
            marker = next(m for m in log.batches[i + 1:] if m.producer_id == b.producer_id and m.marker is not None)
            if not marker.marker:
                continue
        out += [r.offset for r in b.records if r.offset >= start]
    return out


def kafka_aborted_list(log: SimpleNamespace, first: int, end: int) -> list:
    """What Kafka lists with an answer covering [first, end): the aborted transactions that
    overlap it, (producer id, first offset)."""
    out, begun = [], {}
    for b in log.batches:
        if b.transactional and b.marker is None:
            begun.setdefault(b.producer_id, b.offset)
        elif b.marker is not None:
            start = begun.pop(b.producer_id)
            if not b.marker and start < end and b.offset >= first:
                out.append((b.producer_id, start))
    return out


def from_offset(log: SimpleNamespace, offset: int, limit: int, headers_only: bool = False) -> list:
    """What an answer from ``offset`` holds: up to ``limit`` batches below ``limit``'s end,
    the first cut at ``offset`` as a broker hands it."""
    out = []
    for b in log.batches:
        if b.next_offset <= offset or b.offset >= limit:
            continue
        records = () if headers_only else tuple(r for r in b.records if r.offset >= offset)
        out.append(Batch(max(b.offset, offset), b.next_offset, b.producer_id, b.transactional, b.marker, records))
    return out


def read_committed(log: SimpleNamespace, start: int, sizes: list, with_list: bool) -> list:
    """Read the log from ``start`` as the source does: answers of ``sizes`` batches up to the
    LSO; an undecided batch sends the reader ahead, reading batch headers to the log's end."""
    end = log.batches[-1].next_offset if log.batches else 0
    f, position, delivered = CommittedFilter(start), start, []
    for step in range(1000):
        answer = from_offset(log, position, log.lso)[: sizes[step % len(sizes)]]
        if not answer:
            return delivered
        listed = kafka_aborted_list(log, answer[0].offset, answer[-1].next_offset) if with_list else []
        resolved = f.resolve(answer, listed)
        delivered += [r.offset for r in resolved.records]
        position = resolved.through
        while resolved.undecided is not None and f.outcome(resolved.undecided) is None:
            assert f.known_through < end, "an undecided batch below the LSO has its marker in the log"
            f.learn(from_offset(log, f.known_through, end, headers_only=True)[: sizes[step % len(sizes)]])
    raise AssertionError("the reader made no progress")


@settings(max_examples=300, deadline=None)
@given(transactional_logs(), st.lists(st.integers(1, 6), min_size=1, max_size=5), st.booleans(), st.data())
def test_from_any_offset_exactly_the_committed_records_are_delivered(log, sizes, with_list, data):
    end = log.batches[-1].next_offset if log.batches else 0
    start = data.draw(st.integers(0, max(0, end)))
    assert read_committed(log, start, sizes, with_list) == committed_offsets(log, start)


def test_an_aborted_transaction_the_broker_lists_is_dropped_without_its_marker():
    """Its marker lies past the answer: the broker's list is enough. A committed one past the
    answer is undecided until its marker is read."""
    f = CommittedFilter(0)
    answer = [Batch(0, 2, 5, True, None, ("a0", "a1")), Batch(2, 3, -1, False, None, ("p",)), Batch(3, 5, 6, True, None, ("c0", "c1"))]
    first = f.resolve(answer, aborted=[(5, 0)])
    assert (first.records, first.through, first.undecided) == (["p"], 3, answer[2])
    f.learn([Batch(5, 6, 5, True, False), Batch(6, 7, 6, True, True)])  # read ahead: 5 aborts, 6 commits
    again = f.resolve(answer[2:], aborted=[])
    assert (again.records, again.through, again.undecided) == (["c0", "c1"], 5, None)


def test_a_marker_past_a_hole_is_not_taken_for_the_next_one():
    """A producer's outcome is its next marker: only markers known without a hole count."""
    f = CommittedFilter(0)
    f.learn([Batch(0, 1, -1, False, None, ("x",))])
    assert f.outcome(Batch(0, 1, 9, True)) is None
    f.learn([Batch(1, 2, 9, True, True), Batch(2, 3, 9, True, False)])
    assert f.outcome(Batch(0, 1, 9, True)) is True and f.outcome(Batch(1, 2, 9, True)) is False


# -- recorded fetch answers, byte for byte -------------------------------------------------

def batch_bytes(base: int, values: list, producer_id: int = -1, codec: int = 0, control: bool = False) -> bytes:
    """A record batch as a broker stores it at ``base``: transactional when it has a producer
    id; a control batch (``values`` = [commit?]) with a marker record."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 20, transactional=producer_id >= 0,
                                   producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                   base_sequence=0 if producer_id >= 0 else -1)
    for v in values:
        if control:  # key: version 0, type 1 commit / 0 abort; value: version, coordinator epoch
            builder.append(timestamp=1, key=struct.pack(">hh", 0, 1 if v else 0), value=struct.pack(">hi", 0, 0), headers=[])
        else:  # padded: a codec compresses only what it makes smaller
            builder.append(timestamp=1, key=None, value=v + b" " * 200, headers=[("h", b"1")])
    builder.close()
    buf = bytearray(builder.buffer())
    struct.pack_into(">q", buf, 0, base)  # the base offset: the broker's, outside the checksum
    if control:
        (attributes,) = struct.unpack_from(">h", buf, DefaultRecordBase.ATTRIBUTES_OFFSET)
        struct.pack_into(">h", buf, DefaultRecordBase.ATTRIBUTES_OFFSET, attributes | DefaultRecordBase.CONTROL_MASK)
        struct.pack_into(">I", buf, DefaultRecordBase.CRC_OFFSET, calc_crc32c(memoryview(buf)[DefaultRecordBase.ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def recorded_answer(records: bytes, high_watermark: int, last_stable_offset: int, aborted: list, version: int = 12):
    """A FetchResponse partition as a broker's answer arrives: encoded, then decoded."""
    part_class = FetchResponse.FetchableTopicResponse.PartitionData
    part = part_class(partition_index=0, error_code=0, high_watermark=high_watermark, last_stable_offset=last_stable_offset,
                      log_start_offset=0, preferred_read_replica=-1, records=records,
                      aborted_transactions=[part_class.AbortedTransaction(producer_id=p, first_offset=o) for p, o in aborted])
    response = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=[part])])
    return FetchResponse.decode(response.encode(version=version), version=version).responses[0].partitions[0]


def test_recorded_answers_with_the_aborted_list_deliver_the_committed_records_only():
    """Producer 7's first transaction (offsets 0-2, lz4) is aborted: its abort marker (9) lies
    past the first answer, which the last stable offset (8: producer 8's transaction is open)
    cuts there; the broker lists it. Producer 9's zstd transaction commits at 6."""
    log = (batch_bytes(0, [b"a0", b"a1", b"a2"], producer_id=7, codec=3)
           + batch_bytes(3, [b"p3"])
           + batch_bytes(4, [b"c4", b"c5"], producer_id=9, codec=4)
           + batch_bytes(6, [True], producer_id=9, control=True)
           + batch_bytes(7, [b"p7"], codec=2))
    part = recorded_answer(log, high_watermark=11, last_stable_offset=8, aborted=[(7, 0)])
    answer = partition_answer(part, 0, where="t[0]")
    assert (answer.high_watermark, answer.last_stable_offset, answer.aborted) == (11, 8, ((7, 0),))
    assert [b.codec for b in answer.batches] == [3, 0, 4, 0, 2] and answer.batches[3].marker is True
    f = CommittedFilter(0)
    resolved = f.resolve(answer.batches, answer.aborted)
    assert [r.value.strip() for r in resolved.records] == [b"p3", b"c4", b"c5", b"p7"]
    assert all(r.headers == [("h", b"1")] for r in resolved.records)
    assert (resolved.through, resolved.undecided) == (8, None)

    # Fetched again from 1 (a replay from inside the aborted transaction): the same records on.
    again = partition_answer(recorded_answer(log, 11, 8, aborted=[(7, 0)]), 1)
    assert [r.value.strip() for r in CommittedFilter(1).resolve(again.batches, again.aborted).records] == [b"p3", b"c4", b"c5", b"p7"]

    # Without the list (Tansu, librdkafka's mock cluster) the aborted batch waits for its marker.
    bare = partition_answer(recorded_answer(log, 11, 8, aborted=[]), 0)
    waiting = CommittedFilter(0).resolve(bare.batches, bare.aborted)
    assert (waiting.records, waiting.through, waiting.undecided.offset) == ([], 0, 0)


def test_a_recorded_answer_at_version_4_carries_the_list_too():
    log = batch_bytes(0, [b"x"], producer_id=3) + batch_bytes(1, [False], producer_id=3, control=True) + batch_bytes(2, [b"y"])
    answer = partition_answer(recorded_answer(log, 3, 3, aborted=[(3, 0)], version=4), 0)
    resolved = CommittedFilter(0).resolve(answer.batches, answer.aborted)
    assert [r.value.strip() for r in resolved.records] == [b"y"] and resolved.through == 3
