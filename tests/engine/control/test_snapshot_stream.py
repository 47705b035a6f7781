"""SnapshotInbox / SnapshotStream: snapshots sent over a real TCP connection reach the
stream of their schedule, in order; other schedules' messages and strangers do not."""

from __future__ import annotations

import asyncio
import time

import pytest

from driftstream.engine.runtime.protocol import ScheduleEnded, SnapshotTaken
from driftstream.engine.control.snapshot_stream import SnapshotInbox, SnapshotStream
from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.runtime.handshake import HandshakeError
from driftstream.engine.runtime.transport import Endpoint


@pytest.fixture
def inbox():
    inbox = SnapshotInbox("127.0.0.1")
    yield inbox
    inbox.close()


def send_all(address: tuple, key: PlaneKey, messages: list) -> None:
    """Connect to ``address`` as the acker does and send ``messages`` in order."""

    async def run():
        peer = Endpoint(key, None)
        await peer.connect("supervisor", address)
        for m in messages:
            peer.send("supervisor", m)
        await asyncio.sleep(0.05)  # let the writes leave before the connection closes
        await peer.close()

    asyncio.run(run())


def item(snapshot_id: int) -> tuple:
    return (snapshot_id, (snapshot_id, 0), {(0, 0): {"sources": {}, "states": {}}}, [], 0.0, 0.001)


def drain(stream: SnapshotStream, timeout: float = 5.0) -> list:
    """Every item of ``stream`` until its end."""
    got = []
    while stream.wait(timeout):
        taken = stream.take()
        if taken is None:
            return got
        got.append(taken)
    raise AssertionError(f"the stream did not end; got {got}")


def test_items_of_the_stream_arrive_in_order_and_others_are_dropped(inbox):
    stream = SnapshotStream(inbox, number=2, first_id=3, patience=10.0)
    messages = [SnapshotTaken(1, item(1)), SnapshotTaken(2, item(3)), ScheduleEnded(1), SnapshotTaken(2, item(4)), ScheduleEnded(2)]
    send_all(inbox.address, inbox.key, messages)
    assert drain(stream) == [item(3), item(4)]
    assert stream.next_id == 5


def test_a_peer_without_the_secret_is_not_heard(inbox):
    stream = SnapshotStream(inbox, number=1, first_id=1, patience=10.0)
    with pytest.raises(HandshakeError):  # the inbox does not prove itself to a peer of another key either
        send_all(inbox.address, PlaneKey.new(), [SnapshotTaken(1, item(1)), ScheduleEnded(1)])
    assert not stream.wait(0.3)
    send_all(inbox.address, inbox.key, [SnapshotTaken(1, item(1)), ScheduleEnded(1)])
    assert drain(stream) == [item(1)]


def test_nothing_arrived_is_a_timeout_and_then_overdue(inbox):
    stream = SnapshotStream(inbox, number=1, first_id=1, patience=0.2)
    started = time.time()
    assert not stream.wait(0.1)
    assert time.time() - started >= 0.09
    assert not stream.overdue()
    time.sleep(0.2)
    assert stream.overdue()
    with pytest.raises(RuntimeError):
        stream.take()
