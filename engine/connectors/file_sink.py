"""FileSink: each sink partition appends JSON lines to its own file, one fsync per bundle.

Every element becomes one line ``{"t": <Meta as a JSON list>, "value": <payload>}``, compact
JSON in UTF-8 (:func:`~driftstream.barriers.json_payloads.json_bytes`; a newline byte never
occurs inside a multi-byte character, so scanning for line ends and cutting a torn last line
are safe); NaN and infinities are refused, as other readers (jq, Spark) reject them.
A bundle is written with one ``write`` and made durable with one ``os.fsync``;
returning from ``write`` is the acknowledgement. After a crash the last complete
line says which element the file holds last, so a half-written bundle is still
exact: reopening cuts the partial trailing line off, ``t_last`` returns the
Meta of the last durable line, and the barrier replays from right after it.

Only JSON is ever read back (no pickle), so a file from anywhere is safe to open.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     sink = FileSink(d, name="out")
...     part = sink.open(0, 1)
...     part.write(Bundle([(Meta(1, 0, 0, 1), {"word": "hi"}), (Meta(2, 0, 0, 2), "x")]))
...     part.close()
...     with open(os.path.join(d, "out-0.jsonl")) as f:
...         print(f.read(), end="")
...     again = sink.open(0, 1)        # e.g. after recovery
...     print(again.t_last())
...     again.close()
...     print([v for _, v in read_file_sink(d, "out")])
{"t":[1,0,0,1,[],false],"value":{"word":"hi"}}
{"t":[2,0,0,2,[],false],"value":"x"}
Meta(ts=2, source=0, partition=0, offset=2, child_ids=(), tombstone=False)
[{'word': 'hi'}, 'x']
"""

from __future__ import annotations

import glob
import json
import os
import re
import string
from typing import Any, Optional, Union

import orjson

from driftstream.barriers.bundle import Bundle
from driftstream.barriers.json_payloads import ORJSON_OPTIONS, json_bytes
from driftstream.ordering.accelerators import accelerator
from driftstream.ordering.meta import Meta, meta_from_json

from driftstream.engine.model.connectors import Sink, SinkPartition

PathLike = Union[str, "os.PathLike[str]"]

# How much of the file end to read per step when looking for the last complete line.
_TAIL_BLOCK = 64 * 1024

_TEMPLATE_FIELDS = {"name", "partition"}

#: The Kafka sink's C encoders (``_record_batch.c``), whose ``json_lines`` makes a bundle's
#: lines in one call; None where it is not built (the Python below does the same).
NATIVE = accelerator("driftstream.engine.connectors.kafka._record_batch")


def _is_template(path: str) -> bool:
    return "{" in path


def _template_fields(template: str) -> list:
    """The ``(field, format_spec)`` pairs of a path template, validated."""
    fields = [(f, spec) for _, f, spec, _ in string.Formatter().parse(template) if f is not None]
    unknown = {f for f, _ in fields} - _TEMPLATE_FIELDS
    if unknown:
        raise ValueError(f"FileSink path template {template!r}: unknown field(s) {sorted(unknown)}; use {{name}} and {{partition}}")
    if "partition" not in {f for f, _ in fields}:
        # Without it every partition would append to the same file and interleave.
        raise ValueError(f"FileSink path template {template!r} needs a {{partition}} field")
    return fields


def partition_path(path_template_or_dir: PathLike, name: str, partition: int) -> str:
    """The file of one partition: ``<dir>/<name>-<partition>.jsonl``, or the template filled in.

    >>> partition_path("/data/out", "words", 3)
    '/data/out/words-3.jsonl'
    >>> partition_path("/data/{name}/part-{partition:03d}.jsonl", "words", 3)
    '/data/words/part-003.jsonl'
    """
    path = os.fspath(path_template_or_dir)
    if _is_template(path):
        _template_fields(path)
        return path.format(name=name, partition=partition)
    return os.path.join(path, f"{name}-{partition}.jsonl")


def _scan_tail(fd: int, size: int) -> tuple:
    """``(durable_end, last_line)``: the byte offset just after the last newline (0 if none)
    and the bytes of the last complete line (None if there is none).

    Reads backwards from the end in blocks, so reopening a large file stays cheap.
    """
    pos, buf = size, b""
    while pos > 0:
        step = min(_TAIL_BLOCK, pos)
        pos -= step
        os.lseek(fd, pos, os.SEEK_SET)
        buf = _read_exactly(fd, step) + buf
        end = buf.rfind(b"\n")
        # Done once the buffer holds the last newline and the one before it (the start
        # of the last complete line), or reaches the start of the file.
        if end >= 0 and (pos == 0 or buf.rfind(b"\n", 0, end) >= 0):
            break
    end = buf.rfind(b"\n")
    if end < 0:
        return 0, None
    start = buf.rfind(b"\n", 0, end) + 1  # -1 + 1 == 0: the line starts the file
    return pos + end + 1, buf[start:end]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _append_durably(fd: int, data: Union[bytes, bytearray]) -> None:
    """Write all of ``data`` at the end of ``fd``, then fsync it. Its own function so that a
    profile tells this thread's wait for the disk (the GIL released) from the encoding's CPU."""
    view = memoryview(data)
    while view:  # os.write may write less than asked (e.g. signals, quotas)
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def _parse_line(line: bytes, where: str) -> tuple:
    """One line back to ``(Meta, value)``; a malformed complete line is an error, never skipped."""
    try:
        record = json.loads(line)
        return meta_from_json(record["t"]), record["value"]
    except (ValueError, KeyError, TypeError) as exc:
        # A newline-terminated line that does not parse is not a torn write we can
        # explain: dropping it silently could lose acknowledged output.
        raise ValueError(f"{where}: not a FileSink record ({exc}): {line[:200]!r}") from exc


def _fsync_dir(path: str) -> None:
    """Make a newly created file's directory entry durable (POSIX only)."""
    if os.name != "posix":
        return
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_lines(elements: list, sink_name: str = "") -> Union[bytes, bytearray]:
    """The lines a FileSink writes for ``(meta, payload)`` elements, each
    ``{"t": meta, "value": payload}`` in :func:`json_bytes`' JSON and a newline. TypeError
    naming the sink and the element if a payload is not JSON. In C where it is built
    (``json_lines`` of ``_record_batch.c``: one call a bundle, no Python frame a line);
    :func:`python_json_lines` is the reference, and says what failed when the C raises.

    >>> json_lines([((1, 0, 0, 1, (), False), {"w": "é"})])
    b'{"t":[1,0,0,1,[],false],"value":{"w":"\\xc3\\xa9"}}\\n'
    """
    if NATIVE is not None and type(elements) is list:
        try:
            return NATIVE.json_lines(elements, json_bytes, orjson.dumps, ORJSON_OPTIONS, _line)
        except Exception:  # noqa: BLE001 - the Python raises it again, naming the element
            pass
    return python_json_lines(elements, sink_name)


def _line(meta: Any, payload: Any) -> bytes:
    return json_bytes({"t": meta, "value": payload})  # a tuple is a JSON array


def python_json_lines(elements: Any, sink_name: str = "") -> Union[bytes, bytearray]:
    """:func:`json_lines` in Python: the reference, and the path of any bundle the C refuses."""
    # Appended to one buffer, each line freed as it is copied: a list of a bundle's lines
    # alive at once cost 3.5 us a line against 0.5 (on this VM, malloc's fresh memory for
    # thousands of live ~1 KiB blocks orjson allocates and shrinks).
    buffer = bytearray()
    for meta, payload in elements:
        try:
            buffer += _line(meta, payload)
        except (TypeError, ValueError) as exc:  # ValueError: NaN, circular reference
            raise TypeError(
                f"FileSink {sink_name!r} cannot write the element at t={tuple(meta)!r}: "
                f"its payload must be JSON-serialisable ({exc})"
            ) from exc
        buffer += b"\n"
    return buffer


class FileSinkPartition(SinkPartition):
    """One partition's file, opened for appending; a partial trailing line is cut off on open."""

    def __init__(self, sink_name: str, path: str) -> None:
        self.sink_name = sink_name
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        created = not os.path.exists(path)
        # A raw fd, not a buffered file: after a failed write nothing is left in a
        # user-space buffer that a later close() could flush into the middle of the file.
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd: Optional[int] = os.open(path, flags, 0o644)
        try:
            if created:
                _fsync_dir(path)
            size = os.fstat(self._fd).st_size
            end, line = _scan_tail(self._fd, size)
            if end < size:
                # The tail after the last newline is a write that crashed midway: it was
                # never acknowledged, and the barrier will replay it from t_last().
                os.ftruncate(self._fd, end)
            self._last = None if line is None else _parse_line(line, f"{path} (last line)")[0]
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self._failed = False

    def write(self, bundle: Bundle) -> None:
        """Append the bundle's lines, then fsync once; returning acknowledges the bundle.

        Every line is encoded before anything is written, so a payload that is not
        JSON fails the whole bundle and leaves the file as it was.
        """
        if self._fd is None:
            raise ValueError(f"FileSink {self.sink_name!r}: partition file {self.path} is closed")
        if self._failed:
            # After an I/O error the file may end in a partial line; only reopening
            # (which truncates it) makes appending safe again.
            raise OSError(f"FileSink {self.sink_name!r}: an earlier write to {self.path} failed; reopen the partition")
        if not bundle.elements:
            return
        data = json_lines(bundle.elements, self.sink_name)
        try:
            _append_durably(self._fd, data)
        except BaseException:
            self._failed = True
            raise
        # Through JSON and back, so it is exactly what reopening would read from the file.
        self._last = meta_from_json(json.loads(json_bytes(bundle.elements[-1][0])))

    def t_last(self) -> Optional[Meta]:
        """The Meta of the last complete line in the file, or None if it has none."""
        return self._last

    def collected(self) -> None:
        """None: the output is in the file (see :func:`read_file_sink`)."""
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileSink(Sink):
    """JSON-lines files, one per partition: ``<dir>/<name>-<partition>.jsonl`` by default.

    ``path_template_or_dir`` is a directory, or a path template with a ``{partition}``
    field and optionally ``{name}``, e.g. ``"out/{name}/part-{partition:03d}.jsonl"``.
    The sink appends: a file that already exists is continued (that is how recovery
    resumes), so point a fresh run at a fresh location.

    >>> FileSink("/tmp/x/{name}.jsonl", name="out")
    Traceback (most recent call last):
    ...
    ValueError: FileSink path template '/tmp/x/{name}.jsonl' needs a {partition} field
    """

    def __init__(self, path_template_or_dir: PathLike, name: str) -> None:
        super().__init__(name)
        self.path = os.fspath(path_template_or_dir)
        if _is_template(self.path):
            _template_fields(self.path)  # fail at flow definition, not in an actor

    def partition_path(self, partition: int) -> str:
        return partition_path(self.path, self.name, partition)

    def open(self, partition: int, partitions: int) -> FileSinkPartition:
        if not 0 <= partition < partitions:
            raise ValueError(f"FileSink {self.name!r}: partition {partition} out of range for {partitions} partitions")
        return FileSinkPartition(self.name, self.partition_path(partition))

    def read(self) -> list:
        """Everything this sink's files hold; see :func:`read_file_sink`."""
        return read_file_sink(self.path, self.name)

    def __repr__(self) -> str:
        return f"FileSink({self.path!r}, name={self.name!r})"


def _partition_files(path_template_or_dir: PathLike, name: str) -> list:
    """``(partition, path)`` of every existing partition file of sink ``name``, by partition."""
    path = os.fspath(path_template_or_dir)
    if not _is_template(path):
        # A regex, not a glob: "out-*.jsonl" would also match the files of a sink "out-2".
        pattern = re.compile(re.escape(name) + r"-(\d+)\.jsonl")
        found = []
        if os.path.isdir(path):
            for entry in os.listdir(path):
                m = pattern.fullmatch(entry)
                if m:
                    found.append((int(m.group(1)), os.path.join(path, entry)))
        return sorted(found)
    # Template: glob with every field as "*", then keep a hit only if filling the
    # template with the partition number it contains gives back exactly that path
    # (this honours format specs like {partition:03d}).
    parts = []
    for literal, field, _, _ in string.Formatter().parse(path):
        parts.append(glob.escape(literal))
        if field == "name":
            parts.append(glob.escape(name))
        elif field == "partition":
            parts.append("*")
    _template_fields(path)
    found = []
    for hit in glob.glob("".join(parts)):
        for digits in re.findall(r"\d+", hit):
            p = int(digits)
            if partition_path(path, name, p) == hit:
                found.append((p, hit))
                break
    return sorted(found)


def read_partition_file(path: str) -> list:
    """The ``(Meta, value)`` pairs of one partition file; a partial trailing line is ignored.

    Read-only: unlike reopening the partition, it does not truncate anything.
    """
    with open(path, "rb") as f:
        data = f.read()
    out = []
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a partial line from a crash
    for i, line in enumerate(lines, 1):
        out.append(_parse_line(line, f"{path}:{i}"))
    return out


def read_file_sink(path_template_or_dir: PathLike, name: str) -> list:
    """All ``(Meta, value)`` pairs of sink ``name``, merged across partitions in Meta order.

    For tests and tools. Values come back as JSON gives them (tuples become lists,
    dict keys strings). Elements with equal Metas keep partition order.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     sink = FileSink(d, name="out")
    ...     parts = [sink.open(p, 2) for p in range(2)]
    ...     parts[0].write(Bundle([((1, 0, 0, 1, (), False), "a"), ((3, 0, 0, 3, (), False), "c")]))
    ...     parts[1].write(Bundle([((2, 0, 1, 2, (), False), "b")]))
    ...     for part in parts:
    ...         part.close()
    ...     [(m.ts, v) for m, v in read_file_sink(d, "out")]
    [(1, 'a'), (2, 'b'), (3, 'c')]
    """
    out: list = []
    for _, path in _partition_files(path_template_or_dir, name):
        out.extend(read_partition_file(path))
    # Each file is already in Meta order; a stable sort of the concatenation is a
    # near-linear merge (Timsort finds the runs) and stays correct if a file is not.
    out.sort(key=_first)
    return out


def _first(pair: tuple) -> Any:
    return pair[0]
