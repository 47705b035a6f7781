"""Errors a user sees: build-time (`FlowError`) and run-time (`StepError`)."""

from __future__ import annotations

from typing import Any, Optional

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
