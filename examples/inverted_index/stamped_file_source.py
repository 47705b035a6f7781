"""A FileSource that stamps the time of its first read: the files basis's "from first read" clock
(:mod:`.files_basis`). Its own module, so that the plain loop's process need not import the engine.

>>> import tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> _ = (d / "a.jsonl").write_text('{"n": 1}\\n')
>>> source = StampedFileSource([str(d / "a.jsonl")], stamp=str(d / "stamp"))
>>> part = source.open(0, source_id=0)
>>> (d / "stamp").exists(), [v for _, v in part.read(10)], (d / "stamp").exists()
(False, [{'n': 1}], True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from driftstream.engine.connectors.file_source import FilePartition, FileSource

from .files_basis import stamp_first_read


class StampedFilePartition(FilePartition):
    """A file partition that stamps its source's file at its first read (once per open: a
    recovery's reopen finds the stamp there and leaves it)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._stamped = False

    def read(self, max_items: int) -> list:
        if not self._stamped:
            self._stamped = True
            stamp_first_read(Path(self.source.stamp))
        return super().read(max_items)


class StampedFileSource(FileSource):
    """:class:`FileSource` whose partitions stamp ``stamp`` (a path) at the first read of any."""

    def __init__(self, paths: Any, stamp: str, **options: Any) -> None:
        super().__init__(paths, **options)
        self.stamp = stamp

    def open(self, partition: int, source_id: int, start: Optional[tuple] = None) -> StampedFilePartition:
        return StampedFilePartition(self, self.paths[partition], partition, source_id, start)
