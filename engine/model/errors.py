"""Errors a user sees: build-time (`FlowError`), run-time (`StepError`), and the
`DeadLetter` a step with ``on_error="dead-letter"`` sends instead of failing."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Optional

#: A step's ``on_error`` policies: stop the run with a StepError, or divert the element.
ON_ERROR = ("fail", "dead-letter")

REPR_LIMIT = 200


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr`` cut to ``limit`` characters, for error messages.

    >>> short_repr("x" * 500).endswith("... (502 chars)")
    True
    """
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the real error
        text = f"<unreprable {type(value).__name__}: {exc}>"
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} chars)"
    return text


class FlowError(ValueError):
    """An invalid pipeline, reported before any actor starts, with how to fix it."""


class StepError(RuntimeError):
    """A user function raised while processing an element.

    ``step`` is the step's name, ``element`` a truncated repr of the element,
    ``t`` its Meta, ``cause`` the original exception's type and text.
    """

    def __init__(self, step: str, element: str, t: Any, cause: str, traceback_text: Optional[str] = None) -> None:
        self.step, self.element, self.t, self.cause = step, element, t, cause
        self.traceback_text = traceback_text
        super().__init__(f"step {step!r} failed on element {element} at t={t!r}: {cause}")

    def __reduce__(self):
        return (StepError, (self.step, self.element, self.t, self.cause, self.traceback_text))


class DataPlaneError(RuntimeError):
    """A message between a run's actors could not be loaded or handled: an engine fault,
    which fails the run with the peer's name and the cause.

    >>> str(DataPlaneError("ii/by_word/0", "acker", "KeyError: 3"))
    'data plane: acker could not load or handle a message from ii/by_word/0: KeyError: 3'
    """

    def __init__(self, peer: str, receiver: str, cause: str) -> None:
        self.peer, self.receiver, self.cause = peer, receiver, cause
        super().__init__(f"data plane: {receiver} could not load or handle a message from {peer}: {cause}")

    def __reduce__(self):
        return (DataPlaneError, (self.peer, self.receiver, self.cause))


@dataclass(frozen=True)
class DeadLetter:
    """An element whose step raised, under ``on_error="dead-letter"``: the step's name, the
    element, its position ``t`` (Meta's times and child ids), the exception's type and text,
    and the traceback of the user's code. It leaves the step at the element's own t, so a
    run's dead letters are a function of its input, like its output.

    >>> try:
    ...     int("x")
    ... except ValueError as exc:
    ...     letter = dead_letter("parse", (1, 0, 0, 7, ()), "x", exc)
    >>> letter.step, letter.element, letter.t, letter.error
    ('parse', 'x', (1, 0, 0, 7, ()), "ValueError: invalid literal for int() with base 10: 'x'")
    """

    step: str
    element: Any
    t: tuple
    error: str
    traceback: str


def dead_letter(step: str, meta: tuple, element: Any, exc: BaseException, engine_frames: int = 1) -> DeadLetter:
    """The dead letter of ``element``; call it in the ``except`` of the frame that called the
    user's function, or ``engine_frames`` frames above it: those frames are left out of the
    traceback, which then holds the user's frames alone and is the same wherever the engine
    called it from."""
    frames = exc.__traceback__
    for _ in range(engine_frames):
        if frames is not None and frames.tb_next is not None:
            frames = frames.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    return DeadLetter(step, element, tuple(meta[:4]) + (tuple(meta[4]),), f"{type(exc).__name__}: {exc}", text)


def is_dead_letter(x: Any) -> bool:
    return type(x) is DeadLetter


def is_not_dead_letter(x: Any) -> bool:
    return type(x) is not DeadLetter
