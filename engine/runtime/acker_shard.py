"""An acker shard's protocol, written once: it folds the messages of its share of the stage
instances (:class:`~.protocol.Ack`, :class:`~.protocol.Prepared`) and sends the root acker
one :class:`~.protocol.ShardFlush` per turn of its loop (``defer``: the Ray loop's
``call_soon``; the simulator's scheduler chooses when). Why a batch of net XORs and not a
shard's least time: :mod:`driftstream.ordering.ack_shards`. With ``relay``, it also passes
the root's watermarks and snapshot markers on to its instances, in the order they came
(the root then sends a push to each shard, not to each instance).

>>> from driftstream.engine.runtime.protocol import Ack, Prepared
>>> sent, later = [], []
>>> shard = AckShardHost(sent.append, defer=later.append)
>>> shard.receive(Ack({(1, 0, 0, 1): 5}, 0, (1, 0, 0, 1)))
>>> shard.receive(Ack({(1, 0, 0, 1): 5, (1, 0, 0, 2): 9}, None, None))
>>> shard.receive(Prepared(1, (1, 0), {}))
>>> len(later), sent                                      # one flush scheduled, nothing sent yet
(1, [])
>>> later.pop()(); sent
[ShardFlush(xors={(1, 0, 0, 2): 9}, bounds={0: (1, 0, 0, 1)}, flushes=2, parts=[Prepared(snapshot_id=1, instance=(1, 0), part={})])]

Costs: :meth:`receive` is the shard's fold (O(times in the message)); a flush O(times with
a net change).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from driftstream.ordering.ack_shards import AckShard

from driftstream.engine.runtime.acker_host import at_once
from driftstream.engine.runtime.protocol import Prepared, ShardFlush, Told, Watermark


class AckShardHost:
    """One acker shard: ``send(message)`` to the root acker, ``defer(fn)`` to run ``fn`` after
    the messages already received (a burst of flushes then makes one batch)."""

    def __init__(self, send: Callable[[Any], None], defer: Callable[[Callable[[], None]], None] = at_once,
                 relay: Optional[Callable[[Any, Any], None]] = None, instances: Optional[list] = None) -> None:
        self.shard = AckShard()
        #: ``relay(instance, message)``: the transport to this shard's ``instances``
        self._relay, self.instances = relay, list(instances or [])
        self.parts: list = []
        self._send, self._defer = send, defer
        self.scheduled = False
        #: flushes folded and batches sent, for the figures
        self.received = self.sent = 0

    def receive(self, message: Any) -> None:
        """A stage instance's ``Ack`` (folded) or ``Prepared`` part (sent on after the acks before
        it), or the root's ``Watermark`` (passed on to every instance of this shard at once) or
        ``Told`` (passed on to its instance)."""
        kind = type(message)
        if kind is Watermark:
            for key in self.instances:
                self._relay(key, message)
            return
        if kind is Told:  # one instance's frontier, in order behind what came before it
            self._relay(message.to, Watermark(message.t))
            return
        if kind is Prepared:
            self.parts.append(message)
        else:
            self.shard.add(message.xors, message.source_index, message.bound)
            self.received += 1
        if not self.scheduled:
            self.scheduled = True
            self._defer(self.flush)

    def flush(self) -> None:
        """Send the root what was received since the last flush, as one message."""
        self.scheduled = False
        batch = self.shard.drain()
        if batch is None and not self.parts:
            return
        parts, self.parts = self.parts, []
        if batch is None:
            self._send(ShardFlush({}, {}, 0, parts))
        else:
            self._send(ShardFlush(batch.xors, batch.bounds, batch.flushes, parts))
        self.sent += 1

    @property
    def pending(self) -> bool:
        """Whether a flush is due (what the simulator's scheduler may choose to run)."""
        return self.scheduled
