"""Name the mistake a wrong answer makes.

Each exercise has a catalogue of :class:`Mistake`\\ s: a name, an explanation, the
section of the notebook that teaches the right idea, and an implementation that makes
exactly that mistake. A wrong answer is run on the same input as every mistake in the
catalogue; the first mistake that produces the same result (or raises the same error)
is named in the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .compare import is_close


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to solve an exercise."""

    name: str
    explanation: str
    section: str
    fn: Callable[..., Any]

    def message(self) -> str:
        """The paragraph a student reads when their answer makes this mistake."""
        return (
            f"This looks like the mistake '{self.name}': {self.explanation} "
            f"Section '{self.section}' of this notebook explains it."
        )


@dataclass(frozen=True)
class Outcome:
    """What a call produced: a value, or an exception's type and message; the inputs it changed in place."""

    value: Any = None
    error: tuple[str, str] | None = None
    mutated: tuple[int | str, ...] = ()  # positions (and keyword names) of the tensor arguments it changed


def run(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None) -> Outcome:
    """Call ``fn`` and record its result or its error (never raises)."""
    try:
        return Outcome(value=fn(*args, **(kwargs or {})))
    except Exception as error:  # noqa: BLE001 - a mistake may fail, that is its signature
        return Outcome(error=(type(error).__name__, str(error)))


def diagnose(
    student: Outcome,
    mistakes: Sequence[Mistake],
    args: Sequence[Any],
    kwargs: dict | None = None,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-8,
) -> Mistake | None:
    """The first mistake whose outcome on ``args`` equals the student's, or None."""
    for mistake in mistakes:
        theirs = run(mistake.fn, args, kwargs)
        if student.error is not None or theirs.error is not None:
            if student.error == theirs.error:
                return mistake
            continue
        if is_close(student.value, theirs.value, rtol, atol):
            return mistake
    return None
