"""A manifest as the store writes it: canonical JSON with its SHA-256 in ``"checksum"``, and
read back, checked. Pure: no store, no filesystem.

>>> data = encode_manifest({"requires": [3]}, 7)
>>> decode_manifest(data)
({'requires': [3], 'snapshot_id': 7}, None)
>>> decode_manifest(data.replace(b"[3]", b"[4]"))[1].startswith("does not match its checksum")
True
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

#: the store's own field of a stored manifest: ``sha256:<hex>`` of the rest, canonical JSON
CHECKSUM = "checksum"


def encode_manifest(manifest: dict, snapshot_id: int) -> bytes:
    """The bytes of ``manifest`` as committed: ``"snapshot_id"`` added (one it has must agree),
    then ``"checksum"``. ValueError/TypeError for what would not read back the same (tuples,
    non-str keys, NaN) or a checksum of the caller's. O(its length)."""
    if not isinstance(manifest, dict):
        raise TypeError(f"a manifest is a dict, not {type(manifest).__name__}")
    if manifest.get("snapshot_id", snapshot_id) != snapshot_id:
        raise ValueError(f"manifest says snapshot_id={manifest['snapshot_id']!r}, committed as {snapshot_id}")
    if CHECKSUM in manifest:
        raise ValueError(f"{CHECKSUM!r} is the store's own field of a manifest (the SHA-256 it writes): leave it out")
    manifest = {**manifest, "snapshot_id": snapshot_id}
    # One line: with ``indent`` json falls back to its pure-Python encoder, ~0.7 ms a commit.
    text = json.dumps(manifest, sort_keys=True)
    if json.loads(text) != manifest:
        raise ValueError("the manifest does not survive JSON unchanged (tuples, non-str keys or NaN?)")
    # The checksum goes last, spliced in rather than encoded again: a reader drops it and
    # re-encodes the rest with sorted keys, which gives ``text`` back.
    return f'{text[:-1]}, "{CHECKSUM}": "{digest(text)}"}}'.encode("utf-8")


def decode_manifest(data: bytes) -> tuple:
    """``(manifest, problem)``: the manifest without its checksum, or None and what is wrong
    (it does not parse, is no object, or does not match its checksum). A manifest written
    before checksums comes back with the problem ``None`` and no check: see :func:`has_checksum`."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "does not parse"
    if not isinstance(manifest, dict):
        return None, "is not a JSON object"
    expected = manifest.pop(CHECKSUM, None)
    if expected is not None:
        got = digest(json.dumps(manifest, sort_keys=True))
        if got != expected:
            return None, f"does not match its checksum ({got} where {expected!r} was written: it was changed after its commit)"
    return manifest, None


def has_checksum(data: bytes) -> bool:
    """Whether stored manifest bytes carry a checksum (those written before checksums do not)."""
    return f'"{CHECKSUM}":'.encode() in data


def digest(text: str) -> str:
    """``sha256:<hex>`` of a manifest's canonical JSON. O(its length)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def links_in(manifest: dict) -> tuple:
    """``(requires, bases)``: the older snapshots whose files ``manifest`` is built on, and the
    snapshots of its participants' bases (None when it does not say: written before it did).

    >>> links_in({"requires": [1, 2], "bases": [1]})
    ([1, 2], [1])
    """
    bases: Optional[list] = manifest.get("bases")
    return [int(i) for i in manifest.get("requires", [])], None if bases is None else [int(i) for i in bases]
