"""Errors a user sees: build-time (`FlowError`), run-time (`StepError`), and the
`DeadLetter` a step with ``on_error="dead-letter"`` sends instead of failing."""

from __future__ import annotations

import dataclasses
import os
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


class FlowGone(RuntimeError):
    """A call reached a coordinator after the flow it named had ended there."""


class StepError(RuntimeError):
    """A user function raised while processing an element.

    ``step`` is the step's name, ``element`` a truncated repr of the element,
    ``t`` its Meta, ``cause`` the original exception's type and text, ``traceback_text``
    the whole traceback where it was raised. The message names the element by where its
    input came from (source, partition, offset), shows the user's own frames (file, line,
    code: on Ray the exception itself stays in the actor's process) and says what to do.

    >>> print(StepError("parse", "'x'", (3, 0, 1, 7, (2,), False), "ValueError: bad"))
    step 'parse' failed on element value 'x' (source 0, partition 1, offset 7, output 2 of it): ValueError: bad
    what to do: fix the function, or give the step on_error="dead-letter" to send failing elements to a dead-letter sink; \
reproduce in one process with flow.run(runtime="simulator", seed=N) (driftstream run --runtime simulator --seed N)
    """

    def __init__(self, step: str, element: str, t: Any, cause: str, traceback_text: Optional[str] = None) -> None:
        self.step, self.element, self.t, self.cause = step, element, t, cause
        self.traceback_text = traceback_text
        where = user_frames(traceback_text) if traceback_text else ""
        super().__init__(f"step {step!r} failed on element value {element} ({readable_t(t)}): {cause}\n"
                         + (f"{where}\n" if where else "") + STEP_HINT)

    def __reduce__(self):
        return (StepError, (self.step, self.element, self.t, self.cause, self.traceback_text))


STEP_HINT = ('what to do: fix the function, or give the step on_error="dead-letter" to send failing elements to a '
             'dead-letter sink; reproduce in one process with flow.run(runtime="simulator", seed=N) '
             '(driftstream run --runtime simulator --seed N)')

#: a frame in one of these folders is the engine's, not the user's
_ENGINE_DIRS = tuple(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep + d + os.sep
                     for d in ("engine", "ordering", "snapshots", "barriers"))


def readable_t(t: Any) -> str:
    """Where an element's input came from, read from its Meta ``(ts, source, partition,
    offset, child_ids, tombstone)``; anything else as its repr.

    >>> readable_t((5, 1, 0, 42, (), False))
    'source 1, partition 0, offset 42'
    >>> readable_t((5, 1, 0, 42, (3, 0), True))
    'source 1, partition 0, offset 42, output 3, 0 of it, a retraction'
    """
    if not (isinstance(t, tuple) and len(t) == 6):
        return f"t={t!r}"
    _, source, partition, offset, child_ids, tombstone = t
    text = f"source {source}, partition {partition}, offset {offset}"
    if child_ids:
        text += f", output {', '.join(map(str, child_ids))} of it"
    return text + (", a retraction" if tombstone else "")


def user_frames(traceback_text: str, limit: int = 6) -> str:
    """The frames of ``traceback_text`` outside the engine's own files (the user's
    function and what it called), as Python prints them, the innermost ``limit``. A chained
    traceback (the engine's error raised from the user's) keeps the user's part.

    >>> print(user_frames('''Traceback (most recent call last):
    ...   File "/home/me/flow.py", line 3, in f
    ...     return 1 / x
    ... ZeroDivisionError: division by zero'''))
      File "/home/me/flow.py", line 3, in f
        return 1 / x
    """
    frames: list = []
    for line in traceback_text.splitlines():
        stripped = line.strip()
        if stripped.startswith('File "'):
            path = stripped[6:stripped.find('"', 6)]
            frames.append([line] if not path.startswith(_ENGINE_DIRS) else None)
        elif frames and frames[-1] is not None and line.startswith("    "):
            frames[-1].append(line)
        elif not line.startswith(" "):  # an exception's own line, or a chain's "The above ..."
            frames.append(None)
    kept = [f for f in frames if f is not None][-limit:]
    return "\n".join(line for frame in kept for line in frame)


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


#: Bytes of a failing element, and of its error text and traceback, that its dead letter
#: keeps, as a source's ``BadRecord`` keeps of a record (``connectors/bad_record.py``): a
#: letter must stay writable (a Kafka topic refuses messages over its ``max.message.bytes``,
#: 1 MiB by default, and a refused letter failed the run).
LETTER_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class DeadLetter:
    """An element whose step raised, under ``on_error="dead-letter"``: the step's name, the
    element, its position ``t`` (Meta's times and child ids), the exception's type and text,
    and the traceback of the user's code. It leaves the step at the element's own t, so a
    run's dead letters are a function of its input, like its output.

    An element over :data:`LETTER_MAX_BYTES` (its UTF-8 text, its bytes, else its JSON,
    else its repr) is kept cut to that many bytes (a str, or bytes), an error text or
    traceback likewise: ``truncated`` says so and ``element_size`` is the element's size in
    bytes (None when nothing was cut). The element stays in the source, where ``t`` says.

    >>> try:
    ...     int("x")
    ... except ValueError as exc:
    ...     letter = dead_letter("parse", (1, 0, 0, 7, ()), "x", exc)
    >>> letter.step, letter.element, letter.t, letter.error, letter.truncated
    ('parse', 'x', (1, 0, 0, 7, ()), "ValueError: invalid literal for int() with base 10: 'x'", False)
    """

    step: str
    element: Any
    t: tuple
    error: str
    traceback: str
    #: True if the element, the error or the traceback was cut at LETTER_MAX_BYTES
    truncated: bool = False
    #: the element's size in bytes when the letter was cut (None: nothing was)
    element_size: Optional[int] = None


def dead_letter(step: str, meta: tuple, element: Any, exc: BaseException, engine_frames: int = 1) -> DeadLetter:
    """The dead letter of ``element``; call it in the ``except`` of the frame that called the
    user's function, or ``engine_frames`` frames above it: those frames are left out of the
    traceback, which then holds the user's frames alone and is the same wherever the engine
    called it from. Cut to :data:`LETTER_MAX_BYTES` each: the element, the error, the
    traceback (an element that says whether it was cut, a ``truncated`` field as a
    source's ``BadRecord`` has, was cut by its maker and is kept as it is)."""
    frames = exc.__traceback__
    for _ in range(engine_frames):
        if frames is not None and frames.tb_next is not None:
            frames = frames.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    error = f"{type(exc).__name__}: {_exc_text(exc)}"
    kept, size = _cut_element(element)
    error, error_cut = _cut_text(error)
    text, text_cut = _cut_text(text)
    if size is None and not (error_cut or text_cut):
        return DeadLetter(step, element, tuple(meta[:4]) + (tuple(meta[4]),), error, text)
    if size is None:
        size = _size_of(element)[0]
    return DeadLetter(step, kept, tuple(meta[:4]) + (tuple(meta[4]),), error, text, True, size)


def _exc_text(exc: BaseException) -> str:
    """``str(exc)``, or what its broken ``__str__`` raised."""
    try:
        return str(exc)
    except Exception as broken:  # the letter must not fail on it
        return f"<unprintable {type(exc).__name__}: {type(broken).__name__}>"


def _cut_text(text: str) -> tuple:
    """``(text, False)``, or cut to LETTER_MAX_BYTES of UTF-8 with ``True``. O(len) when long."""
    if len(text) <= LETTER_MAX_BYTES // 4:  # at most 4 bytes a character: no need to encode
        return text, False
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= LETTER_MAX_BYTES:
        return text, False
    return data[:LETTER_MAX_BYTES].decode("utf-8", "ignore"), True


def _size_of(element: Any) -> tuple:
    """``(size in bytes, its bytes or text)``: of bytes as they are, of a str in UTF-8, of
    anything else its JSON as the JSON sinks write it, or else its repr."""
    if isinstance(element, (bytes, bytearray, memoryview)):
        data = bytes(element)
        return len(data), data
    if isinstance(element, str):
        data = element.encode("utf-8", "surrogatepass")
        return len(data), data
    from driftstream.barriers.json_payloads import json_bytes

    try:
        data = json_bytes(element)
    except (TypeError, ValueError, OverflowError, RecursionError):
        data = short_repr(element, limit=2**62).encode("utf-8", "surrogatepass")  # whole: no limit
    return len(data), data


def _cut_element(element: Any) -> tuple:
    """``(element, None)`` if it fits a letter; else ``(what is kept, its size in bytes)``:
    the first LETTER_MAX_BYTES of its bytes (bytes), or of its text, JSON or repr (a str)."""
    if isinstance(element, (int, float, bool)) or element is None:
        return element, None
    if dataclasses.is_dataclass(element) and not isinstance(element, type) and hasattr(element, "truncated"):
        return element, None
    if isinstance(element, str) and len(element) <= LETTER_MAX_BYTES // 4:
        return element, None
    size, data = _size_of(element)
    if size <= LETTER_MAX_BYTES:
        return element, None
    if isinstance(element, (bytes, bytearray, memoryview)):
        return data[:LETTER_MAX_BYTES], size
    return data[:LETTER_MAX_BYTES].decode("utf-8", "ignore"), size


def is_dead_letter(x: Any) -> bool:
    return type(x) is DeadLetter


def is_not_dead_letter(x: Any) -> bool:
    return type(x) is not DeadLetter
