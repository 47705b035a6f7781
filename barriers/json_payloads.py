"""What JSON sinks (files, Kafka) do with payloads that JSON has no type for: a dataclass,
such as a window's ``WindowResult`` or a ``Late`` element, is written as an object of its
fields (what orjson does natively).

>>> import json
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Point:
...     x: int
...     y: tuple
>>> json.dumps([Point(1, (2, 3))], default=json_default)
'[{"x": 1, "y": [2, 3]}]'
"""

from __future__ import annotations

import dataclasses
from typing import Any


def as_fields(value: Any) -> Any:
    """A dataclass instance as the dict of its fields (one level); anything else as it is:
    what JSON sinks and row sinks (a table's columns) take a dataclass element for.

    >>> @dataclasses.dataclass
    ... class Row:
    ...     word: str
    >>> as_fields(Row("a")), as_fields({"word": "b"})
    ({'word': 'a'}, {'word': 'b'})
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value


def json_default(value: Any) -> Any:
    """The ``default=`` of ``json.dumps``: a dataclass instance becomes the dict of its fields
    (one level: the encoder calls it again for nested ones); anything else is refused."""
    fields = as_fields(value)
    if fields is value:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return fields
