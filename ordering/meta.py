"""`Meta`: an element's position t(x) in the total order.

Every element carries a Meta. Its first four fields are the *global time* of the
input the element derives from; ``child_ids`` says which output of which
flat_map it is; ``tombstone`` marks an invalidation of the element with the
same Meta otherwise.

Meta is a tuple, so the total order is Python's tuple order and costs one
native comparison:

>>> a = Meta(5, 0, 1, 5)
>>> a < a.child(0) < a.child(1) < Meta(6, 0, 0, 6)
True
>>> a.child(0) < a.child(0).as_tombstone()     # a tombstone sorts after its invalidee
True

A global time (a plain 4-tuple, also the acker's bucket key) compares against
a Meta the way the watermark needs: every Meta whose global time is below ``w``
is below ``w``, every other Meta is not.

>>> Meta(5, 0, 1, 5, (3,)) < (5, 0, 1, 6)
True
>>> Meta(5, 0, 1, 5, (3,)) < (5, 0, 1, 5)
False
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: A global time: ``(ts, source, partition, offset)``.
Time = tuple

#: Below every time. A watermark at BOTTOM has settled nothing.
BOTTOM: Time = (float("-inf"),)
#: Above every time. A watermark at TOP has settled everything.
TOP: Time = (float("inf"),)


class Meta(NamedTuple):
    """Position of an element: global time, then child ids, then the tombstone flag."""

    ts: Any
    source: int
    partition: int
    offset: int
    child_ids: tuple = ()
    tombstone: bool = False

    @property
    def time(self) -> Time:
        """The global time, the acker's bucket key.

        >>> Meta(1, 0, 0, 1, (2,)).time
        (1, 0, 0, 1)
        """
        return self[:4]

    def child(self, k: int) -> "Meta":
        """The Meta of the k-th output of a flat_map applied to this element.

        >>> Meta(1, 0, 0, 1).child(2).child(0).child_ids
        (2, 0)
        """
        return Meta._make(child_of(self, k))

    def as_tombstone(self) -> "Meta":
        """The Meta of the tombstone that invalidates this element."""
        return Meta._make(tombstone_of(self))

    def invalidee(self) -> "Meta":
        """For a tombstone: the Meta of the element it invalidates."""
        return Meta._make(invalidee_of(self))

    def to_json(self) -> list:
        """A JSON-safe form (for headers, files); inverse of :func:`meta_from_json`.

        >>> meta_from_json(Meta(3, 1, 0, 7, (1,)).to_json())
        Meta(ts=3, source=1, partition=0, offset=7, child_ids=(1,), tombstone=False)
        """
        return meta_to_json(self)


# The hot path keeps metas as plain 6-tuples (a NamedTuple costs ~10x more to
# build and to unpickle); they compare and hash equal to the Meta of the same fields.


def child_of(meta: tuple, k: int) -> tuple:
    """Plain-tuple :meth:`Meta.child`.

    >>> child_of((1, 0, 0, 1, (), False), 3)
    (1, 0, 0, 1, (3,), False)
    """
    return (meta[0], meta[1], meta[2], meta[3], meta[4] + (k,), meta[5])


def tombstone_of(meta: tuple) -> tuple:
    """Plain-tuple :meth:`Meta.as_tombstone`."""
    return (meta[0], meta[1], meta[2], meta[3], meta[4], True)


def invalidee_of(meta: tuple) -> tuple:
    """Plain-tuple :meth:`Meta.invalidee`."""
    return (meta[0], meta[1], meta[2], meta[3], meta[4], False)


def meta_to_json(meta: tuple) -> list:
    """Plain-tuple :meth:`Meta.to_json`.

    >>> meta_to_json((3, 1, 0, 7, (1,), False))
    [3, 1, 0, 7, [1], False]
    """
    return [meta[0], meta[1], meta[2], meta[3], list(meta[4]), meta[5]]


def meta_from_json(value: list) -> Meta:
    """Rebuild a Meta from :meth:`Meta.to_json` output."""
    ts, source, partition, offset, child_ids, tombstone = value
    return Meta(ts, source, partition, offset, tuple(child_ids), bool(tombstone))


def successor(t: Time) -> Time:
    """The smallest global time above ``t`` (offsets are integers).

    A source bound ``b`` says every time ``<= b`` of that source was emitted;
    as an exclusive frontier that is ``successor(b)``.

    >>> successor((4, 0, 1, 9))
    (4, 0, 1, 10)
    >>> successor(TOP) == TOP and successor(BOTTOM) == BOTTOM
    True
    """
    if len(t) < 4:
        return t
    return (t[0], t[1], t[2], t[3] + 1)
