"""Restoring a stateful step instance from slices: parts of other participants' chains,
each restricted to a range of key groups (what an instance takes over when a flow
changes its parallelism; see ``engine/model/reassignment.py``).

Each slice's base checkpoint is downloaded aside and only its range is copied: one
seek to the range's first key group, then its records, never the rest (keys are
stored under their group, :mod:`.state_keys`). Then each slice's deltas, rows of
the range only, are re-applied over what its base gave. Slices hold disjoint
groups, so their order does not matter. A slice marked ``legacy`` (a snapshot from
before key groups) has no group prefixes: its records are all read, regrouped, and
kept if they fall in the range.

>>> import tempfile, os
>>> from driftstream.snapshots.backend import RocksDBBackend
>>> from driftstream.snapshots.store import SnapshotStore
>>> from driftstream.snapshots.state_keys import StateKeys
>>> root = tempfile.mkdtemp(); keys = StateKeys()
>>> old = RocksDBBackend(os.path.join(root, "old"), keys)
>>> for word in ("a", "b", "c", "d"): old.put(word, word.upper())
>>> store = SnapshotStore(os.path.join(root, "store"))
>>> _ = store.upload(1, "f-k-0-n", old.checkpoint(os.path.join(root, "cp")))
>>> groups = [keys.group_of("b"), keys.group_of("b") + 1]
>>> new = RocksDBBackend(os.path.join(root, "new"), keys)
>>> restore_slices(store, [{"participant": "f-k-0-n", "base": 1, "deltas": [], "groups": groups}], new, None, root)
1
>>> [k for k, _ in new.items()]
['b']
>>> old.close(); new.close()
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

from driftstream.ordering.key_groups import GroupRange

from .backend import RocksDBBackend
from .changelog import DELTA_FILE, REMOVED, delta_rows, replay_deltas
from .codec import encode
from .store import SnapshotStore

#: Records copied from a slice's base per RocksDB write call.
COPY_BATCH = 4096


def restore_slices(store: SnapshotStore, slices: list, db: RocksDBBackend, fn: Optional[Callable[[Any, Any], tuple]],
                   scratch: Union[str, Path]) -> int:
    """Fill ``db`` (empty) with the state of ``slices``; ``fn`` re-applies deltas that hold
    inputs. Returns the records copied from bases. Costs: a download of each slice's base,
    then O(records in its range) (O(all its records) for a legacy slice), plus its deltas."""
    copied = 0
    for s in slices:
        copied += _copy_base(store, s, db, scratch)
    for s in slices:
        groups = _groups(s)
        deltas = [delta_rows(store.get_file(d, s["participant"], DELTA_FILE), db.keys, groups) for d in s["deltas"]]
        try:
            states = replay_deltas(deltas, db.get_encoded, fn)
        except Exception as exc:
            raise RuntimeError(f"participant {s['participant']!r}: re-applying the inputs of snapshots {s['deltas']} failed: {exc!r}") from exc
        db.put_encoded([(k, state if state is REMOVED else encode(state)) for k, state in states.items()])
    return copied


def _groups(slice_: dict) -> Optional[GroupRange]:
    return GroupRange(*slice_["groups"]) if "groups" in slice_ else None


def _copy_base(store: SnapshotStore, slice_: dict, db: RocksDBBackend, scratch: Union[str, Path]) -> int:
    """Copy the records of ``slice_``'s range from its base into ``db``."""
    aside = Path(tempfile.mkdtemp(prefix="slice-", dir=scratch))
    try:
        store.download(slice_["base"], slice_["participant"], aside / "db")
        src = RocksDBBackend(aside / "db", db.keys)
        try:
            groups, keys, batch, copied = _groups(slice_), db.keys, [], 0
            if slice_.get("legacy"):
                records = ((k2, v) for k, v in src.raw_items() for k2 in (keys.from_legacy(k),) if groups is None or keys.group(k2) in groups)
            else:
                records = src.raw_items(groups)
            for record in records:
                batch.append(record)
                if len(batch) >= COPY_BATCH:
                    db.put_encoded(batch)
                    copied, batch = copied + len(batch), []
            db.put_encoded(batch)
            return copied + len(batch)
        finally:
            src.close()
    finally:
        shutil.rmtree(aside, ignore_errors=True)
