"""What leaves a stage instance: its outputs bound for other stages, gathered in a batch
per destination (stage, instance, entry step) until the runtime takes them.

A keyed channel sends each item to the owner of its key's group at this parallelism; the
owners of str and int keys are remembered (hashing a key costs more than a dict lookup).
Each batch holds the acker's watermark at the least time of its items, so the watermark
cannot pass an item in flight.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySink, MemorySource
>>> flow = Flow("doc")
>>> flow.source(MemorySource([])).key_by(len, name="by_len").stateful_map(lambda s, x: (x, x)).sink(MemorySink("out"))
>>> plan = flow.plan(2)
>>> out, acks = Outbound(plan, instance=0, new_batch_id=iter(range(1, 99)).__next__), AckTable()
>>> for ch in plan.channels[plan.stages[0].step_ids[-1]]:
...     out.route(ch, [((i, 0, 0, i, (), False), "x" * i, None) for i in range(1, 7)], acks)
>>> sorted((inst, [p for _, p, _ in b.items]) for _, inst, b in out.take(sender=(0, 0), more=False))
[(0, ['xx', 'xxx', 'xxxxx']), (1, ['x', 'xxxx', 'xxxxxx'])]
>>> acks          # each batch holds the watermark at its least item, XORed with its id
{(1, 0, 0, 1): 1, (2, 0, 0, 2): 2}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from driftstream.engine.model.errors import dead_letter
from driftstream.engine.model.plan import Plan
from driftstream.engine.runtime.operators import step_error
from driftstream.ordering.ack_table import AckTable
from driftstream.ordering.meta import child_of

#: Keys whose owner an instance remembers per keyed step it routes to (cleared when full).
OWNERS_CACHED = 1 << 16


@dataclass
class Batch:
    """Elements sent from one stage instance to another: ``(meta, payload, key)`` triples.

    ``batch_id`` was XORed by the sender into the acker entry of every time in
    ``times`` (one: its items' least, see ``_OutBuffer``); the receiver XORs it again
    once the batch is processed. ``sender``: the
    sending instance, ``(stage index, instance)`` (the input merge's channel); ``more``:
    the sender's input is backlogged, its next batch follows at once.
    """

    entry: int
    batch_id: int
    times: list
    items: list
    sender: Any = None
    more: bool = False


@dataclass
class ChannelBatch(Batch):
    """A :class:`Batch` under ``recovery="local"``: its id is XORed into the acker's table of
    ``channel``, ``(sender incarnation, receiver incarnation)`` (ordering/channel_tables.py),
    by its sender and again by its receiver, so a failure can discard what either end held."""

    channel: Any = None


def tagged(items: list, tag: int) -> list:
    """Items entering a merge as input ``tag``: ``tag`` appended to their child_ids."""
    return [(child_of(m, tag), p, k) for m, p, k in items]


class _OutBuffer:
    """A batch being filled. It holds the acker's watermark at the least time of its items
    (``first``), the one entry its id is XORed into: every item is at or after it, so the
    watermark cannot pass one in flight. An entry per item's time (as before) cost the
    acker and both ends a dict update per element, 9 µs an event of Nexmark q5 in the
    acker alone; the watermark now trails by at most a batch's span, which in a backlog
    is far inside the credit window and at the live edge (batches of one) nothing."""

    __slots__ = ("batch_id", "items", "first")

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id
        self.items: list = []
        self.first: Optional[tuple] = None

    def hold(self, t: tuple, acks: AckTable) -> None:
        """Hold the watermark at ``t`` if it is before every item so far (O(1))."""
        first, bid = self.first, self.batch_id
        if first is not None:
            acks.move(first, t, bid)  # XORed out again: the entry moves to t
        else:
            acks.xor(t, bid)
        self.first = t


class _ChannelOutBuffer(_OutBuffer):
    """An :class:`_OutBuffer` whose hold is keyed ``(channel, t)`` (``recovery="local"``)."""

    __slots__ = ("channel",)

    def __init__(self, batch_id: int, channel: tuple) -> None:
        super().__init__(batch_id)
        self.channel = channel

    def hold(self, t: tuple, acks: AckTable) -> None:
        first, bid, ch = self.first, self.batch_id, self.channel
        if first is not None:
            acks.move((ch, first), (ch, t), bid)
        else:
            acks.xor((ch, t), bid)
        self.first = t


class Outbound:
    """The output buffers of one stage instance; ``route`` fills them, ``take`` empties them."""

    def __init__(self, plan: Plan, instance: int, new_batch_id: Callable[[], int]) -> None:
        self.plan = plan
        self.instance = instance
        self.new_batch_id = new_batch_id
        #: (stage index, instance, entry step) -> the batch being filled
        self.buffers: dict = {}
        # Key group -> the instance owning it at this parallelism (see ordering/key_groups.py).
        self._router = plan.key_groups.router(plan.parallelism)
        # Per keyed step routed to: str, int and float keys -> their owner. Keys of these types
        # that are equal hash alike (``2.0 == 2``, ``True == 1``: stable_hash), so one entry serves
        # them all; other types may equal one of these without hashing alike, or have no stable
        # hash at all: hashed every time.
        self._owners: dict = {}

    def __bool__(self) -> bool:
        return bool(self.buffers)

    def pending(self) -> int:
        """The items waiting in the buffers (what :meth:`take` would send). O(buffers)."""
        return sum(len(buf.items) for buf in self.buffers.values())

    def _buffer(self, dest: tuple) -> _OutBuffer:
        buf = self.buffers.get(dest)
        if buf is None:
            buf = self.buffers[dest] = _OutBuffer(self.new_batch_id())
        return buf

    def route(self, ch: Any, outs: list, acks: AckTable) -> None:
        """Put a step's outputs ``(meta, payload, key)`` into channel ``ch``'s buffers, their
        batches' holds XORed into ``acks``. O(len(outs)); a keyed channel calls its key
        function once per item (a StepError names the item it failed on)."""
        if ch.tag is not None:
            outs = tagged(outs, ch.tag)
        if ch.keyed:
            step = self.plan.steps[ch.dst]
            fn, divert = step.fn, step.on_error == "dead-letter"
            router, m, hash_of = self._router, len(self._router), self.plan.key_groups.hash_of
            owners = self._owners.get(ch.dst)
            if owners is None or len(owners) > OWNERS_CACHED:
                owners = self._owners[ch.dst] = {}
            bufs: dict = {}
            try:
                for item in outs:
                    meta, payload = item[0], item[1]
                    try:
                        key = fn(payload)
                    except Exception as exc:
                        if not divert:
                            raise
                        # its dead letter goes on, keyed by the step's name, to the split after it
                        payload, key = dead_letter(step.name, meta, payload, exc), step.name
                    kind = type(key)
                    if kind is str or kind is int or kind is float:
                        dst = owners.get(key)
                        if dst is None:
                            dst = owners[key] = router[hash_of(key) % m]  # the owner of the key's group
                    else:
                        dst = router[hash_of(key) % m]
                    buf = bufs.get(dst)
                    if buf is None:
                        buf = bufs[dst] = self._buffer((ch.dst_stage, dst, ch.dst))
                    buf.items.append((meta, payload, key))
                    first = buf.first
                    if first is None or meta < first:
                        buf.hold(meta[:4], acks)
            except Exception as exc:
                raise step_error(step.name, meta, payload, exc) from exc
        else:
            buf = self._buffer((ch.dst_stage, self.instance, ch.dst))
            append = buf.items.append
            for item in outs:
                append((item[0], item[1], item[2]))  # a key_by's key: the other side of a join needs it
                first = buf.first
                if first is None or item[0] < first:
                    buf.hold(item[0][:4], acks)

    def take(self, sender: tuple, more: bool) -> list:
        """``(stage index, instance, Batch)`` for every non-empty buffer, sent by ``sender``
        (``more``: its input is backlogged); empties them."""
        if not self.buffers:
            return []
        out = [(dest[0], dest[1], Batch(dest[2], buf.batch_id, [buf.first], buf.items, sender, more)) for dest, buf in self.buffers.items()]
        self.buffers = {}
        return out


class ChannelOutbound(Outbound):
    """:class:`Outbound` under ``recovery="local"``: each batch holds the watermark in the table
    of its channel, from this incarnation (``own``) to the receiver's current one
    (``incarnations``: instance -> incarnation, kept current by the runtime), and says so
    (:class:`ChannelBatch`). The default path is :class:`Outbound`'s, untouched.

    >>> from driftstream.engine import Flow
    >>> from driftstream.engine.testing import MemorySink, MemorySource
    >>> flow = Flow("doc")
    >>> flow.source(MemorySource([])).key_by(len, name="by_len").stateful_map(lambda s, x: (x, x)).sink(MemorySink("out"))
    >>> plan, acks = flow.plan(2), AckTable()
    >>> out = ChannelOutbound(plan, 1, iter(range(7, 99)).__next__, {(1, 0): 5, (1, 1): 6}, own=3)
    >>> for ch in plan.channels[plan.stages[0].step_ids[-1]]:
    ...     out.route(ch, [((2, 0, 0, 2, (), False), "xx", None)], acks)
    >>> [(b.channel, b.times) for _, _, b in out.take(sender=(0, 1), more=False)], acks
    ([((3, 5), [(2, 0, 0, 2)])], {((3, 5), (2, 0, 0, 2)): 7})
    """

    def __init__(self, plan: Plan, instance: int, new_batch_id: Callable[[], int], incarnations: dict, own: Any) -> None:
        super().__init__(plan, instance, new_batch_id)
        self.incarnations, self.own = incarnations, own

    def _buffer(self, dest: tuple) -> _OutBuffer:
        buf = self.buffers.get(dest)
        if buf is None:
            channel = (self.own, self.incarnations[(dest[0], dest[1])])
            buf = self.buffers[dest] = _ChannelOutBuffer(self.new_batch_id(), channel)
        return buf

    def take(self, sender: tuple, more: bool) -> list:
        if not self.buffers:
            return []
        out = [(dest[0], dest[1], ChannelBatch(dest[2], buf.batch_id, [buf.first], buf.items, sender, more, buf.channel))
               for dest, buf in self.buffers.items()]
        self.buffers = {}
        return out
