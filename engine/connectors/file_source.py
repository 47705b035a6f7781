"""FileSource: JSON-lines files as a bounded source, one partition per file.

A line's time is ``(ts, source, partition, byte offset of the line)``: ``ts`` is the running
max over the file of ``timestamp(value)`` in ms (as a Kafka partition's record timestamps),
or without ``timestamp`` the line's byte offset. Both come from the file alone, so a replay
from a snapshot's position (the byte offset of the next line and the running ts) gives the
same times. A line that does not decode, or whose ``timestamp`` fails, becomes a dead letter
of the source step at its own t (a :class:`~driftstream.engine.connectors.bad_record.BadRecord`
with the file as its topic and the line's byte offset): nothing is skipped silently. Blank
lines are skipped; a last line without a newline is a line.

Values are parsed as JSON (orjson) by default, never unpickled; ``decode`` takes the line's
bytes (without the newline) for another format.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "a.jsonl"), "w") as f:
...     _ = f.write('{"n": 1, "time": 2.0}\\n{"n": 2, "time": 1.5}\\nnot json\\n')
>>> source = FileSource(os.path.join(d, "*.jsonl"), timestamp=lambda e: e["time"])
>>> part = source.open(0, source_id=0)
>>> [(meta[0], meta[3], getattr(value, "error", value)) for meta, value in part.read(10)]
[(2000, 0, {'n': 1, 'time': 2.0}), (2000, 22, {'n': 2, 'time': 1.5}), (2000, 44, "JSONDecodeError: invalid literal, expected 'null': line 1 column 1 (char 0)")]
>>> part.done, part.position()
(True, (53, 2000))
"""

from __future__ import annotations

import glob
import math
import os
from typing import Any, Callable, Optional, Sequence, Union

import orjson

from driftstream.engine.connectors.bad_record import bad_record
from driftstream.engine.model.connectors import Source, SourcePartition
from driftstream.engine.model.errors import dead_letter
from driftstream.ordering.meta import Time

PathLike = Union[str, "os.PathLike[str]"]

#: Bytes read from a file at a time: ~10k Nexmark events, one ``split`` per read.
READ_BYTES = 1 << 20


def _paths(paths: Union[PathLike, Sequence[PathLike]]) -> list:
    """The files of a glob pattern, a path, or a list of them: sorted, each once."""
    patterns = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    found: list = []
    for pattern in map(os.fspath, patterns):
        hits = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        found.extend(h for h in hits if h not in found)
    return found


class FilePartition(SourcePartition):
    """One file, read in blocks of :data:`READ_BYTES`; O(1) per line beyond its decoding."""

    def __init__(self, source: "FileSource", path: str, partition: int, source_id: int, start: Optional[tuple]) -> None:
        self.source, self.path, self.partition, self.source_id = source, path, partition, source_id
        self._file = open(path, "rb")
        self.size = os.fstat(self._file.fileno()).st_size
        self.pos = 0 if start is None else start[0]  # byte offset of the next line to emit
        self.ts: Optional[int] = None if start is None else start[1]
        self._file.seek(self.pos)
        self._lines: list = []  # complete lines read, not yet emitted
        self._next = 0  # index of the next of them
        self._tail = b""  # bytes after the last newline read
        self._read_to = self.pos  # file offset just past what was read
        self._start, self._emitted = self.pos, 0  # for lag()'s mean line length
        # Lines that failed before the file's first time is known wait for it (their t must
        # not run ahead of the lines after them): (offset, line, exception).
        self._orphans: list = []
        self.done = self.pos >= self.size

    def read(self, max_items: int) -> list:
        out: list = []
        while len(out) < max_items:
            if self._next >= len(self._lines) and not self._fill():
                break
            stop = min(len(self._lines), self._next + max_items - len(out))
            self._emit(self._lines[self._next : stop], out)
            self._emitted += stop - self._next
            self._next = stop
        self.done = self._next >= len(self._lines) and self._read_to >= self.size and not self._tail
        if self.done and self._orphans:  # no line of the file has a time: they get 0
            self._adopt(0, out)
        return out

    def _fill(self) -> bool:
        """Read the next block into ``_lines``; False at the end of the file."""
        block = self._file.read(READ_BYTES) if self._read_to < self.size else b""
        self._read_to += len(block)
        if not block:
            if not self._tail:
                return False
            self._lines, self._tail = [self._tail], b""  # the last line, without a newline
        else:
            lines = (self._tail + block).split(b"\n")
            self._tail = lines.pop()
            self._lines = lines
        self._next = 0
        return bool(self._lines)

    def _emit(self, lines: list, out: list) -> None:
        decode, timestamp, sid, p = self.source.decode, self.source.timestamp, self.source_id, self.partition
        pos, ts = self.pos, self.ts
        for line in lines:
            offset, pos = pos, pos + len(line) + 1
            if not line.strip():
                continue
            try:
                value = decode(line)
                if timestamp is None:
                    ts = offset
                else:
                    at = math.floor(timestamp(value) * 1000)
                    ts = at if ts is None or at > ts else ts
            except Exception as exc:
                if ts is None:
                    self._orphans.append((offset, line, exc))
                else:
                    out.append(self._dead_letter((ts, sid, p, offset, (), False), line, exc))
                continue
            if self._orphans:
                self._adopt(ts, out)
            out.append(((ts, sid, p, offset, (), False), value))
        # the last line of a file without a newline: pos counted one byte too many
        self.pos, self.ts = min(pos, self.size), ts

    def _adopt(self, ts: int, out: list) -> None:
        """Emit the lines that failed before the first time was known, at that time."""
        for offset, line, exc in self._orphans:
            out.append(self._dead_letter((ts, self.source_id, self.partition, offset, (), False), line, exc))
        self._orphans = []

    def _dead_letter(self, meta: tuple, line: bytes, exc: Exception) -> tuple:
        record = bad_record(self.path, self.partition, meta[3], None, None, line)
        return meta, dead_letter(self.source.step_name, meta, record, exc)

    def position(self) -> tuple:
        if self._orphans:
            return (self._orphans[0][0], None)
        return (self.pos, self.ts)

    def bound(self) -> Optional[Time]:
        # Every line still to come starts past pos - 1, and its ts is at least the running ts.
        if self.ts is None or self._orphans:
            return None
        return (self.ts, self.source_id, self.partition, self.pos - 1)

    def lag(self) -> int:
        """Lines not yet read, estimated from the bytes left and the lines read so far (0 at the end)."""
        left = self.size - self.pos
        if left <= 0:
            return 0
        mean = (self.pos - self._start) / self._emitted if self._emitted else 100.0
        return max(1, round(left / max(mean, 1.0)))

    def close(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"FilePartition({self.path!r} at byte {self.pos} of {self.size})"


class FileSource(Source):
    """JSON-lines files (a glob pattern, a path, or a list of them), one partition per file.

    ``timestamp(value) -> seconds``: the elements' source time, what event-time windows close
    on (default: the line's byte offset, a time that only orders the file). ``decode(bytes)``:
    a line to its value (default: JSON). ``alignment_slack``: how far past the slowest file,
    in ms of ``timestamp``, a file is read under ``source_alignment="auto"`` (default 2 ms with
    ``timestamp``, as Kafka's; not aligned without one). The files must not change while a flow
    reads them: a recovery reads them again from a snapshot's byte offsets.

    >>> FileSource("/nowhere/*.jsonl")
    Traceback (most recent call last):
    ...
    ValueError: FileSource: no file matches /nowhere/*.jsonl
    """

    emits_dead_letters = True

    def __init__(self, paths: Union[PathLike, Sequence[PathLike]], timestamp: Optional[Callable[[Any], float]] = None,
                 decode: Callable[[bytes], Any] = orjson.loads, alignment_slack: Optional[float] = None) -> None:
        self.paths = _paths(paths)
        missing = [p for p in self.paths if not os.path.isfile(p)]
        if not self.paths or missing:
            raise ValueError(f"FileSource: no file matches {', '.join(map(os.fspath, missing)) if missing else paths}")
        self.timestamp, self.decode = timestamp, decode
        self.alignment_slack = alignment_slack if alignment_slack is not None else (2.0 if timestamp is not None else None)

    def partitions(self) -> int:
        return len(self.paths)

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> FilePartition:
        return FilePartition(self, self.paths[partition], partition, source_id, start)

    def __repr__(self) -> str:
        return f"FileSource({len(self.paths)} files: {self.paths[0]!r}{', ...' if len(self.paths) > 1 else ''})"
