"""The output log of a step that is not deterministic (``deterministic=False``): per input
element (its Meta), the outputs the step gave it, so that a replay emits them again instead
of calling the function anew.

A stateless step keeps no state, so after a failure every instance recomputes the elements
at or after the restored snapshot's T. A function of the time, of a random draw or of an
outside service then gives other outputs than those a stateful step after it already folded
into output the sinks released. The log fixes them: an instance records each element's
outputs (:meth:`OutputLog.record`), writes the new entries to the snapshot store in small
segments (:meth:`OutputLog.take_pending`, then :meth:`OutputLog.written`) and acknowledges the
input only once they are durable; a restore loads the segments at or after T
(:meth:`OutputLog.load`), and the step emits the logged outputs of an element it finds there
(:meth:`OutputLog.lookup`).

>>> log = OutputLog()
>>> log.record((1, 0, 0, 1, (), False), [((1, 0, 0, 1, (), False), 0.5, None)])
>>> log.appended, log.durable
(1, 0)
>>> entries, upto = log.take_pending()
>>> data = encode_segment(entries); log.written(upto); log.durable
1
>>> restored = OutputLog()
>>> restored.load(decode_segment(data), since=(1, 0, 0, 1))
>>> restored.lookup((1, 0, 0, 1, (), False))
[((1, 0, 0, 1, (), False), 0.5, None)]
>>> name = segment_name(17, 0, 3, entries); parse_segment_name(name)
SegmentName(written_ns=17, instance=0, seq=3, max_t=(1, 0, 0, 1))

The store holds segments under ``outputs/<flow>-<step>/``, one file each, named by when and
by which instance it was written and by the largest input time it holds
(:func:`segment_name`): a restore reads those at or after T, a trim deletes those below the
oldest committed snapshot, both from a listing. Costs: a record is a dict store and a list
append per input element; a settle sweeps the entries once their count doubled (O(1) per
entry amortised); a segment is one pickle of its entries (the engine's own data).
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Iterable, NamedTuple, Optional

#: The store's folder that holds the output logs, beside the snapshots' numbered folders.
OUTPUTS_DIR = "outputs"

_SEGMENT_VERSION = 1


class SegmentName(NamedTuple):
    """What a segment's file name says: when (``time.time_ns()``) and by which instance it was
    written, its sequence number in that incarnation, and the largest input time it holds."""

    written_ns: int
    instance: int
    seq: int
    max_t: tuple


class OutputLog:
    """One step's log in one stage instance: ``emitted`` (per input Meta, the outputs this
    incarnation emitted for it, until the watermark passes it: a tombstone of the input takes
    them back), ``replay`` (loaded from the store at a restore), and the entries recorded since
    the last write (``pending``; None when nothing is written: a run without snapshots). ``appended`` and ``durable`` count entries recorded and
    written: an input recorded as the n-th is durable once ``durable >= n``."""

    __slots__ = ("emitted", "replay", "pending", "appended", "durable", "_sweep_at")

    def __init__(self) -> None:
        self.emitted: dict = {}
        self.replay: dict = {}
        self.pending: list = []
        self.appended = 0
        self.durable = 0
        self._sweep_at = 64

    def lookup(self, meta: tuple) -> Optional[list]:
        """The logged outputs of input ``meta`` from before the restore, or None (compute them)."""
        return self.replay.get(meta)

    def record(self, meta: tuple, outputs: list, fresh: bool = True) -> None:
        """Input ``meta`` gave ``outputs`` (``(meta, payload, key)`` triples); ``fresh``: computed
        now, so it must be written (a replayed entry is in the store already)."""
        self.emitted[meta] = outputs
        if fresh and self.pending is not None:
            self.pending.append((meta, outputs))
            self.appended += 1

    def retract(self, meta: tuple) -> Optional[list]:
        """What input ``meta`` gave, taken back (its tombstone came); None if it gave nothing here."""
        return self.emitted.pop(meta, None)

    def take_pending(self) -> tuple:
        """``(entries, upto)``: the entries to write now, and the count :meth:`written` is told
        once they are durable."""
        entries, self.pending = self.pending, []
        return entries, self.appended

    def written(self, upto: int) -> None:
        """The entries up to the ``upto``-th are durable."""
        if upto > self.durable:
            self.durable = upto

    @property
    def all_durable(self) -> bool:
        return self.durable >= self.appended

    def load(self, entries: Iterable[tuple], since: Optional[tuple]) -> None:
        """Take logged ``(meta, outputs)`` entries, in the order they were written (a later one
        for the same input replaces an earlier), those at or after time ``since`` (None: all)."""
        replay = self.replay
        for meta, outputs in entries:
            if since is None or meta[:4] >= since:
                replay[meta] = outputs

    def settle(self, watermark: tuple) -> None:
        """Forget the inputs below ``watermark``: no tombstone or replay can reach them now (a
        restore starts at a snapshot's T, which is at or below the watermark, and reloads)."""
        if len(self.emitted) + len(self.replay) < self._sweep_at:
            return
        self.emitted = {m: o for m, o in self.emitted.items() if not m < watermark}
        self.replay = {m: o for m, o in self.replay.items() if not m < watermark}
        self._sweep_at = max(64, 2 * (len(self.emitted) + len(self.replay)))


def encode_segment(entries: list) -> bytes:
    """The bytes of a segment of ``(meta, outputs)`` entries (pickled: the step's own outputs,
    which only the engine reads back, as snapshots hold states)."""
    return pickle.dumps((_SEGMENT_VERSION, [(tuple(m), o) for m, o in entries]), protocol=pickle.HIGHEST_PROTOCOL)


def decode_segment(data: bytes) -> list:
    """The entries of a segment written by :func:`encode_segment`."""
    version, entries = pickle.loads(data)
    if version != _SEGMENT_VERSION:
        raise ValueError(f"an output log segment of version {version!r}; this build reads version {_SEGMENT_VERSION}")
    return entries


def segment_name(written_ns: int, instance: int, seq: int, entries: list) -> str:
    """The file name of a segment of ``entries`` (not empty): see :class:`SegmentName`."""
    max_t = max(tuple(m[:4]) for m, _ in entries)
    code = base64.urlsafe_b64encode(json.dumps(list(max_t)).encode()).decode()
    return f"{written_ns:020d}-{instance}-{seq}-{code}"


def parse_segment_name(name: str) -> Optional[SegmentName]:
    """What ``name`` says (:func:`segment_name`), or None if it is not a segment's name."""
    try:
        written_ns, instance, seq, code = name.split("-", 3)
        max_t = tuple(json.loads(base64.urlsafe_b64decode(code.encode())))
        return SegmentName(int(written_ns), int(instance), int(seq), max_t)
    except (ValueError, TypeError):
        return None


def segments_from(names: Iterable[str], since: Optional[tuple]) -> list:
    """The segment names among ``names`` that may hold inputs at or after ``since`` (None: all), in
    the order they were written (a later entry for an input replaces an earlier one)."""
    parsed = [(p, n) for n in names if (p := parse_segment_name(n)) is not None]
    return [n for p, n in sorted(parsed) if since is None or p.max_t >= since]


def segments_below(names: Iterable[str], t: tuple) -> list:
    """The segment names among ``names`` whose every input is below ``t``: no restore needs them
    once a snapshot at or after ``t`` is the oldest committed one."""
    return [n for n in names if (p := parse_segment_name(n)) is not None and p.max_t < t]
