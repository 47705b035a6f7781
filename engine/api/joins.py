"""The step functions of ``KeyedStream.lookup`` and ``KeyedStream.join(window=...)``.

Both run on the drifting state of one key: the inputs of the step are the two sides,
each element given as ``(side, x)`` (0: this stream, 1: the other one), and the state
is applied in t order whatever the arrival order.

>>> state, out = lookup_step(None, (0, "order-1")); out          # no customer yet
('order-1', None)
>>> state, _ = lookup_step(state, (1, {"name": "Ada"}))
>>> lookup_step(state, (0, "order-2"))[1]
('order-2', {'name': 'Ada'})
>>> state = join_collect(join_collect(None, (0, "l1"))[0], (1, "r1"))[0]
>>> join_pairs("inner")("k", state), join_pairs("outer")("k", (("l1",), ()))
([('k', 'l1', 'r1')], [('k', 'l1', None)])
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

HOWS = ("inner", "left", "outer")


def lookup_step(state: Any, item: tuple) -> tuple:
    """A temporal join: a table update (side 1) becomes the key's value; an element (side 0)
    leaves as ``(element, value or None)``, the value being the key's latest update before it
    in t order. The state is the value in a 1-tuple (an update may be None)."""
    side, x = item
    if side == 1:
        return (x,), None
    return state, (x, None if state is None else state[0])


def join_collect(state: Any, item: tuple) -> tuple:
    """A window join's state: ``(left elements, right elements)``, each in t order. Each
    element copies its side's tuple: O(n) per element, for windows of up to thousands."""
    side, x = item
    lefts, rights = state or ((), ())
    return ((lefts + (x,), rights) if side == 0 else (lefts, rights + (x,))), None


def join_pairs(how: str) -> Callable[[Hashable, Any], list]:
    """What a closed window of a join emits: ``(key, left, right)`` for each pair, lefts then
    rights in t order; with ``how="left"`` a left with no right in its window pairs with None,
    and with ``"outer"`` a right with no left too."""

    def pairs(key: Hashable, state: tuple) -> list:
        lefts, rights = state
        out = [(key, left, right) for left in lefts for right in rights]
        if how in ("left", "outer") and not rights:
            out += [(key, left, None) for left in lefts]
        if how == "outer" and not lefts:
            out += [(key, None, right) for right in rights]
        return out

    return pairs
