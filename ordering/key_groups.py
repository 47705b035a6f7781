"""Key groups: the unit keyed state moves in when a flow changes its parallelism.

A flow has a fixed ``max_parallelism`` (default 128). A key's *group* is its stable
hash, mixed (:func:`.mixed_hash`), modulo ``max_parallelism``; instance ``i`` of ``n`` owns the contiguous range of
groups ``[i * m / n, (i + 1) * m / n)`` (rounded up at both ends, as Flink's
``KeyGroupRangeAssignment``), so a key's owner at any parallelism up to ``m`` follows
from its group alone, and all state is stored under its group: a new instance reads
the ranges it owns from whichever old instances held them, without scanning the rest.

>>> groups = KeyGroups(128)
>>> groups.group_of("apple") == groups.group_of("apple") < 128
True
>>> groups.range_of(0, 3), groups.range_of(1, 3), groups.range_of(2, 3)
(GroupRange(start=0, end=43), GroupRange(start=43, end=86), GroupRange(start=86, end=128))
>>> router = groups.router(3)
>>> router[groups.group_of("apple")] == groups.owner(groups.group_of("apple"), 3)
True
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .partitioning import mixed_hash, stable_hash

#: How a key's group is read from the key: 1, ``stable_hash`` (a CRC-32; keys differing in
#: a few low bits shared an owner); 2, ``mixed_hash``. A snapshot records its flow's, and a
#: flow resumed from it keeps that one (its state is stored under those groups).
KEY_HASH = 2
KEY_HASHES = {1: stable_hash, 2: mixed_hash}

#: What a flow gets when it does not say: the most instances any stage may ever run.
DEFAULT_MAX_PARALLELISM = 128

#: Groups are stored as a 2-byte big-endian prefix of every state key.
MAX_MAX_PARALLELISM = 1 << 15


class GroupRange(NamedTuple):
    """Key groups ``start`` (included) to ``end`` (excluded).

    >>> r = GroupRange(4, 8); 5 in r, 8 in r, len(r), r.overlap(GroupRange(6, 12))
    (True, False, 4, GroupRange(start=6, end=8))
    """

    start: int
    end: int

    def __contains__(self, group: object) -> bool:  # type: ignore[override]
        return isinstance(group, int) and self.start <= group < self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    def overlap(self, other: "GroupRange") -> "GroupRange":
        """The groups in both (empty: ``len() == 0``). O(1)."""
        return GroupRange(max(self.start, other.start), min(self.end, other.end))

    def __str__(self) -> str:
        return f"{self.start}-{self.end - 1}"


class KeyGroups:
    """The key groups of a flow with ``max_parallelism`` groups.

    Costs: :meth:`group_of` is a stable hash (O(len(key))); :meth:`owner` and
    :meth:`range_of` are O(1); :meth:`router` builds an O(max_parallelism) table once,
    after which routing a key is one index.
    """

    def __init__(self, max_parallelism: int = DEFAULT_MAX_PARALLELISM, key_hash: int = KEY_HASH) -> None:
        check_max_parallelism(max_parallelism)
        if key_hash not in KEY_HASHES:
            raise ValueError(f"unknown key hash {key_hash!r}: this driftstream knows {sorted(KEY_HASHES)}")
        self.max_parallelism = max_parallelism
        self.key_hash = key_hash
        #: key -> its hash, the one groups are read from (``hash_of(key) % max_parallelism``)
        self.hash_of = KEY_HASHES[key_hash]

    def group_of(self, key: Any) -> int:
        """The group of ``key`` (any key ``stable_hash`` takes).

        >>> KeyGroups(8).group_of(7) == KeyGroups(8).group_of(7.0)
        True
        """
        return self.hash_of(key) % self.max_parallelism

    def owner(self, group: int, parallelism: int) -> int:
        """The instance of ``parallelism`` that owns ``group``.

        >>> [KeyGroups(4).owner(g, 3) for g in range(4)]
        [0, 0, 1, 2]
        """
        return group * parallelism // self.max_parallelism

    def range_of(self, instance: int, parallelism: int) -> GroupRange:
        """The groups ``instance`` of ``parallelism`` owns: exactly those whose :meth:`owner` it is.

        >>> KeyGroups(4).range_of(0, 3)
        GroupRange(start=0, end=2)
        """
        m = self.max_parallelism
        return GroupRange((instance * m + parallelism - 1) // parallelism, ((instance + 1) * m + parallelism - 1) // parallelism)

    def router(self, parallelism: int) -> list:
        """``table[group]``: the instance owning each group at ``parallelism`` (index it with
        ``hash_of(key) % max_parallelism``)."""
        check_parallelism(parallelism, self.max_parallelism)
        return [self.owner(g, parallelism) for g in range(self.max_parallelism)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyGroups) and (other.max_parallelism, other.key_hash) == (self.max_parallelism, self.key_hash)

    def __hash__(self) -> int:
        return hash((self.max_parallelism, self.key_hash))

    def __repr__(self) -> str:
        return f"KeyGroups({self.max_parallelism})" if self.key_hash == KEY_HASH else f"KeyGroups({self.max_parallelism}, key_hash={self.key_hash})"

    def __reduce__(self):
        return (KeyGroups, (self.max_parallelism, self.key_hash))


def check_max_parallelism(max_parallelism: Any) -> None:
    """ValueError unless ``max_parallelism`` is an int in 1..32768."""
    if type(max_parallelism) is not int or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(f"max_parallelism must be an int from 1 to {MAX_MAX_PARALLELISM}, got {max_parallelism!r}")


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """ValueError unless ``parallelism`` fits under ``max_parallelism`` (each instance owns a group at least)."""
    if parallelism > max_parallelism:
        raise ValueError(
            f"parallelism {parallelism} is above the flow's max_parallelism {max_parallelism}: every instance owns at "
            f"least one key group. Run at {max_parallelism} or less, or give the flow a larger max_parallelism "
            "(Flow(name, max_parallelism=...); a snapshot only restores into the max_parallelism it was taken with)")
