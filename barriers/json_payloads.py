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


def json_default(value: Any) -> Any:
    """The ``default=`` of ``json.dumps``: a dataclass instance becomes the dict of its fields
    (one level: the encoder calls it again for nested ones); anything else is refused."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
