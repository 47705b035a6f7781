"""The bundle: one release of a barrier to its sink."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from driftstream.ordering.meta import Meta


@dataclass
class Bundle:
    """Elements released together, in Meta order; ``t_last`` is the Meta of the last one.

    >>> b = Bundle([(Meta(1, 0, 0, 1), "x"), (Meta(2, 0, 0, 2), "y")])
    >>> b.t_last.ts, b.payloads()
    (2, ['x', 'y'])
    """

    elements: list = field(default_factory=list)
    t_last: Optional[Meta] = None

    def __post_init__(self) -> None:
        if self.t_last is None and self.elements:
            self.t_last = self.elements[-1][0]

    def payloads(self) -> list:
        return [p for _, p in self.elements]

    def __len__(self) -> int:
        return len(self.elements)

    def __bool__(self) -> bool:
        return bool(self.elements)

    def after(self, t_last: Optional[Meta]) -> "Bundle":
        """The part of this bundle strictly after ``t_last`` (what a sink does not have yet).

        >>> Bundle([(Meta(1, 0, 0, 1), "x"), (Meta(2, 0, 0, 2), "y")]).after(Meta(1, 0, 0, 1)).payloads()
        ['y']
        """
        if t_last is None:
            return self
        return Bundle([e for e in self.elements if e[0] > t_last])

