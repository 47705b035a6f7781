"""RocksDB base-state store of one stateful operator instance, with checkpoints.

``RocksDBBackend`` speaks the backend protocol of ``DictBackend`` —
``get(key)`` (None when missing), ``put(key, state)``, ``items()`` — over a RocksDB
directory (through rocksdict). Keys are stored under their key group
(:class:`~.state_keys.StateKeys`), states through ``codec``, and rocksdict runs in
raw-bytes mode, so nothing is ever pickled, in either direction.

>>> import tempfile, os
>>> root = tempfile.mkdtemp()
>>> b = RocksDBBackend(os.path.join(root, "db"))
>>> b.put("k", {"n": 1}); b.get("k"), b.get("missing")
({'n': 1}, None)
>>> cp = b.checkpoint(os.path.join(root, "cp"))     # hard links: milliseconds
>>> b.put("k", {"n": 2})                              # later writes stay out of it
>>> r = RocksDBBackend.restore(cp, os.path.join(root, "restored"))
>>> r.get("k"), b.get("k")
({'n': 1}, {'n': 2})
>>> r.close(); b.close()
>>> import shutil; shutil.rmtree(root)

Keys equal under ``==`` are one key, as in a dict: ``1``, ``1.0`` and ``True``
share a row (see ``codec.encode_key``), and ``items()`` gives back the canonical
form (``1``). Unlike a dict, ``items()`` runs in the byte order of the stored
keys (by key group, then encoded key), not in insertion order.

Costs (2-core machine, small states, codec included): ``get`` about 3 µs,
``put`` about 2.5 µs, ``items`` about 3 µs per key (a ``get`` of a missing key: 0.4 µs,
the bloom filters answer it); larger states add their
codec cost. ``checkpoint`` flushes the memtable and hard-links the files, so it
costs the flush (about 30 ms after 50k fresh puts), not the size of the
database; ``restore`` copies the checkpoint, O(its size).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Hashable, Iterator, Optional, Union

from rocksdict import BlockBasedOptions, Checkpoint, MemtableFactory, Options, Rdict, WriteBatch, WriteOptions

from driftstream.ordering.key_groups import GroupRange

from .changelog import REMOVED
from .codec import decode, encode, encode_many
from .state_keys import StateKeys

PathLike = Union[str, "os.PathLike[str]"]


class RocksDBBackend:
    """Base states of one stateful operator instance in a RocksDB directory at ``path``.

    Opens the database at ``path``, creating it if missing. ``keys``: how the step's
    state keys are stored (their key group; default: the key is its routing key).

    ``bulk``: a database that is written and not read (a fresh instance's, whose cache holds
    every state it has: :attr:`.StateCache.complete`) keeps its writes in a vector memtable,
    an append, and sorts them when it flushes, in RocksDB's own thread: a base's row costs
    the writer 0.13 us instead of the skip list's 0.58 (the flush's sort makes it 0.58 of CPU
    in all, against 0.82). A point read of such a memtable copies and sorts it (15-55 ms at
    50k rows), so the first :meth:`get` ends the mode for good (:meth:`end_bulk`: a flush,
    then the database reopened with the skip list). Iterators read it correctly either way.
    """

    def __init__(self, path: PathLike, keys: Optional[StateKeys] = None, bulk: bool = False) -> None:
        self.path = Path(path)
        self.keys = keys or StateKeys()
        self._encode_key = self.keys.encode
        self._closed = False
        # No write-ahead log: the working database is never recovered after a crash
        # (recovery restores the last checkpoint instead), and a checkpoint flushes
        # the memtable itself, so the WAL would only nearly double the cost of every put (4 µs vs 2 µs measured).
        wo = self._write_options = WriteOptions()
        wo.disable_wal = True
        self.bulk = bulk
        self._db = self._open(bulk)

    def _open(self, bulk: bool) -> Rdict:
        # Raw mode: rocksdict stores our bytes as they are. In its default mode it
        # pickles any value that is not str/int/float/bytes, and unpickles on read.
        options = Options(raw_mode=True)
        # Bloom filters in the table files and the memtable: a state that is not there (a new
        # key, once the cache is no longer complete) is answered without searching either
        # (0.4 instead of 5 us a miss over 1.3M keys; a hit the same, ~4 us; 10 bits a key).
        # The memtable's filter is a share of the write buffer (64 MiB), zeroed at every open
        # and flush: a tenth (6.4 MiB) made an open and close 1.8 ms instead of 1.3 (the
        # simulator opens thousands); a fiftieth answers a miss as fast (0.23 us over 400k keys).
        tables = BlockBasedOptions()
        tables.set_bloom_filter(10, False)
        options.set_block_based_table_factory(tables)
        options.set_memtable_prefix_bloom_ratio(0.02)
        options.set_memtable_whole_key_filtering(True)
        # One thread opens the table files (an instance's database has a handful): RocksDB's
        # default of 16 starts threads at every open, 1.4 instead of 0.85 ms of CPU an open
        # (the simulator opens thousands; a restore or a rescale opens one per instance).
        options.set_max_file_opening_threads(1)
        if bulk:
            options.set_allow_concurrent_memtable_write(False)  # the vector memtable has no concurrent insert
            options.set_memtable_factory(MemtableFactory.vector())
        # The column family's options given, not loaded: rocksdict loads them from the
        # directory's OPTIONS file otherwise, and a checkpoint taken in bulk mode would open
        # with the vector memtable (and fail: its options refuse concurrent writes).
        db = Rdict(str(self.path), options, column_families={"default": options})
        db.set_write_options(self._write_options)
        return db

    def end_bulk(self) -> None:
        """Leave the ``bulk`` mode (see the class doc): flush the memtable (holding the
        interpreter lock: 10-40 ms, once) and reopen the database with a skip list. Nothing
        is lost: the flush has every write in a table file. Does nothing if not bulk."""
        if not self.bulk or self._closed:
            return
        self.bulk = False
        self._db.flush(True)
        self._db.close()
        try:
            self._db = self._open(False)
        except Exception as exc:  # an iterator of the database still alive keeps its lock
            self._closed = True
            raise RuntimeError(f"the state database {self.path} could not leave bulk mode (reopened after its "
                               f"flush): {exc}; an iterator over it was still open") from exc

    def get(self, key: Hashable) -> Any:
        """The state stored for ``key``, or None. O(log n) in RocksDB plus decoding."""
        return self.get_encoded(self._encode_key(key))

    def get_encoded(self, key: bytes) -> Any:
        """The state stored under a stored key (:meth:`StateKeys.encode`), or None."""
        if self.bulk:
            self.end_bulk()  # a point read of the vector memtable would sort it, every read
        raw = self._db.get(key)
        return None if raw is None else decode(raw)

    def is_empty(self) -> bool:
        """True if the database holds no record (one iterator seek: microseconds)."""
        it = self._db.iter()
        it.seek_to_first()
        return not it.valid()

    def put(self, key: Hashable, state: Any) -> None:
        """Store ``state`` for ``key`` (TypeError if the codec cannot encode either); :data:`REMOVED`
        deletes the key's record."""
        if state is REMOVED:
            self._db.delete(self._encode_key(key))
        else:
            self._db.put(self._encode_key(key), encode(state))

    def put_many(self, items: list) -> None:
        """:meth:`put` of each ``(key, state)``, in one RocksDB write: a base writes its states a
        slice at a time (400k puts of entries: 3.0 us each one by one, 2.0 in batches).

        >>> import tempfile
        >>> b = RocksDBBackend(tempfile.mkdtemp() + "/db"); b.put("gone", 1)
        >>> b.put_many([("a", [1]), ("gone", REMOVED)]); b.get("a"), b.get("gone")
        ([1], None)
        >>> b.close()
        """
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        keys = self.keys.encode_many([key for key, _ in items])
        values = encode_many([None if state is REMOVED else state for _, state in items])  # a deletion's None goes unused
        for raw, value, (_, state) in zip(keys, values, items):
            if state is REMOVED:
                delete(raw)
            else:
                put(raw, value)
        self._db.write(batch, self._write_options)

    def fold(self, key: Hashable, state: Any, inputs: list) -> None:
        """The backend protocol's fold: RocksDB keeps the state only."""
        self.put(key, state)

    def put_encoded(self, pairs: list) -> None:
        """Store ``(stored key, encode(state) or REMOVED)`` byte pairs as they are (e.g. states restored
        from deltas, which are keyed by stored keys). O(pairs), no codec."""
        put, delete = self._db.put, self._db.delete
        for k, v in pairs:
            if v is REMOVED:
                delete(k)
            else:
                put(k, v)

    def items(self) -> Iterator[tuple]:
        """Every ``(key, state)``, in the byte order of the stored keys. O(n) over the whole run."""
        decode_key = self.keys.decode
        for k, v in self._db.items():
            yield decode_key(k), decode(v)

    def raw_items(self, groups: Optional[GroupRange] = None) -> Iterator[tuple]:
        """``(stored key, encoded state)`` of every record, or of the key groups ``groups``
        only: one seek, then the range, never the rest. O(records read), no codec."""
        if groups is None:
            yield from self._db.items()
            return
        first, end = StateKeys.bounds(groups)
        it = self._db.iter()
        it.seek(first)
        while it.valid():
            key = it.key()
            if key >= end:
                break
            yield key, it.value()
            it.next()

    def start_flush(self) -> None:
        """Start writing the memtable to a table file in RocksDB's own thread; returns at once.

        :meth:`checkpoint` flushes the memtable itself, holding the interpreter lock
        throughout (rocksdict): 8 / 21 / 37 ms after 5k / 20k / 50k fresh puts of 200
        bytes, with every other thread of the process stopped. Flushed first this way, the
        checkpoint held it 3-4 ms. Poll :meth:`flushing` for the end.
        """
        self._db.flush(False)

    def flushing(self) -> bool:
        """True while a flush is pending or running (two RocksDB properties: microseconds)."""
        db = self._db
        return bool(db.property_int_value("rocksdb.mem-table-flush-pending") or db.property_int_value("rocksdb.num-running-flushes"))

    def checkpoint(self, dest_dir: PathLike) -> Path:
        """Write a consistent RocksDB checkpoint of the current contents into ``dest_dir``.

        ``dest_dir`` must not exist yet (RocksDB refuses an existing directory, even an
        empty one); its parent is created if needed. Immutable table files are hard
        links when ``dest_dir`` is on the same filesystem, copies otherwise. Writes made
        after this call do not reach the checkpoint. Returns ``dest_dir`` as a Path.
        """
        dest = Path(dest_dir)
        if dest.exists():
            raise FileExistsError(f"checkpoint directory {dest} already exists")
        dest.parent.mkdir(parents=True, exist_ok=True)
        Checkpoint(self._db).create_checkpoint(str(dest))
        return dest

    @classmethod
    def restore(cls, checkpoint_dir: PathLike, path: PathLike, keys: Optional[StateKeys] = None) -> "RocksDBBackend":
        """Open a backend at ``path`` holding exactly the states of ``checkpoint_dir``.

        The checkpoint is copied first, never opened in place: opening a RocksDB
        directory writes to it (a new MANIFEST, LOG, LOCK and WAL, then every put),
        so the checkpoint would stop being the snapshot it stands for. ``path`` must
        not exist. Cost: a copy of the checkpoint, O(its size). A directory that is
        already a private copy (e.g. just downloaded from the snapshot store) can be
        opened directly with ``RocksDBBackend(dir)`` instead, saving the copy.
        """
        src, dest = Path(checkpoint_dir), Path(path)
        if not (src / "CURRENT").is_file():
            raise FileNotFoundError(f"{src} is not a RocksDB checkpoint (no CURRENT file)")
        if dest.exists():
            raise FileExistsError(f"restore target {dest} already exists")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest)
        return cls(dest, keys)

    def close(self) -> None:
        """Flush and close the database; calling it again does nothing (other calls then raise DbClosedError)."""
        if not self._closed:
            self._closed = True
            self._db.close()

    def __enter__(self) -> "RocksDBBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RocksDBBackend({str(self.path)!r})"

