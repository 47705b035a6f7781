"""Running aggregates per key: the step functions behind ``KeyedStream.reduce``, ``.fold``
and ``.count``.

Each is a ``stateful_map`` whose state is the key's aggregate and whose output, one per
input, is ``(key, aggregate)``. It runs on the same drifting state as any
``stateful_map``: an element that arrives late re-applies the aggregate of the
elements after it, so the outputs are those of the input taken in t order, whatever
the arrival order, parallelism or failures. The aggregate is held in a 1-tuple, so
that a user aggregate may be None (a state of None means "no element yet").

>>> step = fold_step(0, lambda total, x: total + x, key_fn=lambda x: x % 2)
>>> state, out = step(None, 3); out
(1, 3)
>>> state, out = step(state, 5); out
(1, 8)
>>> step = reduce_step(max, key_fn=len)
>>> state, out = step(None, "ab"); state, out = step(state, "cd"); out
(2, 'cd')

Costs: one call of the user function and one of the key function per element
(and again for each element a late arrival re-applies).
"""

from __future__ import annotations

from typing import Any, Callable


def fold_step(init: Any, fn: Callable[[Any, Any], Any], key_fn: Callable[[Any], Any]) -> Callable:
    """``state, x -> ((aggregate,), (key, aggregate))`` with ``aggregate = fn(previous or init, x)``.

    ``fn`` must not mutate the aggregate it is given (it may be re-applied to the same
    one after a late arrival): return a new value.
    """

    def fold(state: Any, x: Any) -> tuple:
        acc = fn(init if state is None else state[0], x)
        return (acc,), (key_fn(x), acc)

    return fold


def reduce_step(fn: Callable[[Any, Any], Any], key_fn: Callable[[Any], Any]) -> Callable:
    """``state, x -> ((aggregate,), (key, aggregate))``: the first element of a key is its
    aggregate, each later one ``fn(aggregate, x)``."""

    def reduce(state: Any, x: Any) -> tuple:
        acc = x if state is None else fn(state[0], x)
        return (acc,), (key_fn(x), acc)

    return reduce


def _plus_one(n: int, _x: Any) -> int:
    return n + 1


def count_step(key_fn: Callable[[Any], Any]) -> Callable:
    """``(key, how many elements of the key so far, this one included)`` per element.

    >>> step = count_step(str.lower)
    >>> state, out = step(None, "A"); state, out = step(state, "a"); out
    ('a', 2)
    """
    return fold_step(0, _plus_one, key_fn)


# -- windows: a window's state is its aggregate in a 1-tuple; nothing is emitted per element --


def window_fold(init: Any, fn: Callable[[Any, Any], Any]) -> Callable:
    """A window's step: ``fn(aggregate so far or init, x)``.

    >>> step = window_fold(0, lambda n, x: n + x)
    >>> step(step(None, 2)[0], 3)
    ((5,), None)
    """

    def fold(state: Any, x: Any) -> tuple:
        return (fn(init if state is None else state[0], x),), None

    return fold


def window_count(state: Any, _x: Any) -> tuple:
    """A ``count`` window's step: ``window_fold(0, lambda n, x: n + 1)`` in one call (a sliding
    count folds every element with it).

    >>> window_count(window_count(None, "a")[0], "b")
    ((2,), None)
    """
    return (1 if state is None else state[0] + 1,), None


def window_counts(a: tuple, b: tuple) -> tuple:
    """The ``combine`` of ``count`` windows (their states are 1-tuples of counts).

    >>> window_counts((2,), (3,))
    (5,)
    """
    return (a[0] + b[0],)


def window_reduce(fn: Callable[[Any, Any], Any]) -> Callable:
    """A window's step: its first element, then ``fn(aggregate so far, x)``."""

    def reduce(state: Any, x: Any) -> tuple:
        return (x if state is None else fn(state[0], x),), None

    return reduce


def _append(elements: tuple, x: Any) -> tuple:
    return elements + (x,)


def window_collect() -> Callable:
    """A window's step: the tuple of its elements in t order (each element copies it: O(n) per
    element, for windows of up to thousands of elements; use ``fold`` for an aggregate)."""
    return window_fold((), _append)


def window_value(state: tuple) -> Any:
    """A closed window's value: its aggregate."""
    return state[0]


def window_list(state: tuple) -> list:
    """A closed ``collect`` window's value: its elements, as a list."""
    return list(state[0])
