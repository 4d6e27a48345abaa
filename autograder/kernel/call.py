"""One call of the student's code where it runs: under the guard, on copies of its arguments.

:func:`guarded_call` is how every call of a student's function is made in the process that holds
it: in the graded kernel, for each request of the grader (:mod:`autograder.kernel.serve`); in one
process (the student's own notebook, the tests), for each call a check makes
(:func:`autograder.grader.student.attempt`). Its :class:`Outcome` is plain data: the value, or the
error's type and message, and the arguments the call changed in place.

What this does not protect: the guard runs in the same process as the student's code, which can
get round it (:mod:`autograder.kernel.guard`).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..shared.errors import CheckFailed, NotWritten
from .guard import Forbidden, Guard, forbidden_call

#: The package's folder: its frames are no part of the student's traceback.
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_TORCH_MARKERS = ("/torch/", "\\torch\\")


@dataclass(frozen=True)
class Outcome:
    """What a call produced: a value, or an exception's type and message; the inputs it changed in place."""

    value: Any = None
    error: tuple[str, str] | None = None
    mutated: tuple[int | str, ...] = ()  # positions (and keyword names) of the tensor arguments it changed


def copy_argument(value: Any) -> Any:
    """A copy of a tensor argument (other values as they are), for a call that may change it in place."""
    return value.clone() if isinstance(value, torch.Tensor) else value


def _changed(before: Any, after: Any) -> bool:
    """Whether a tensor argument was changed in place (NaN equals NaN; meta tensors hold nothing to change)."""
    if not isinstance(before, torch.Tensor) or before.device.type == "meta":
        return False
    if before.shape != after.shape or before.dtype != after.dtype:
        return True
    return not bool(((before == after) | ((before != before) & (after != after))).all())


def mutated_arguments(originals: Sequence[Any], kw_originals: dict, args: Sequence[Any], kwargs: dict) -> tuple:
    """The positions and keyword names of the tensor arguments that differ from their originals."""
    return (tuple(i for i, (a, b) in enumerate(zip(originals, args)) if _changed(a, b))
            + tuple(k for k in kw_originals if _changed(kw_originals[k], kwargs.get(k))))


def student_frames(error: BaseException) -> str:
    """The traceback lines that belong to the student's own code (no autograder, no torch)."""
    if hasattr(error, "student_frames"):  # raised in the student's kernel, described there
        return str(error.student_frames)
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not str(Path(f.filename).resolve()).startswith(_PACKAGE_DIR)
        and not any(m in f.filename for m in _TORCH_MARKERS)
    ]
    return "".join(traceback.format_list(frames)).rstrip()


def not_written(exercise: str) -> str:
    """The message for an exercise that still raises NotImplementedError."""
    return (
        f"{exercise} is not written yet: it still raises NotImplementedError. "
        "Replace the line `raise NotImplementedError` with your implementation, run its cell, "
        "then run this check again."
    )


def guarded_call(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict | None = None,
    *,
    exercise: str,
    forbid: Sequence[Forbidden] = (),
) -> tuple[Outcome, BaseException | None]:
    """Run the student's ``fn`` here, under a guard; return its outcome and the exception, if any.

    A forbidden call or an unwritten exercise stops the check at once with its message.
    """
    guard = Guard(tuple(forbid), exercise)
    # The student's function gets copies: changing its inputs in place must not change
    # the inputs the reference is computed from (and the copies show whether it did).
    originals, kw_originals = tuple(args), dict(kwargs or {})
    args = tuple(copy_argument(a) for a in originals)
    kwargs = {k: copy_argument(v) for k, v in kw_originals.items()}
    try:
        with guard:
            value = fn(*args, **kwargs)
    except CheckFailed:  # a forbidden call (ForbiddenCall) among them
        raise
    except NotImplementedError:
        raise NotWritten(not_written(exercise)) from None
    except Exception as error:  # noqa: BLE001 - every student error becomes a message
        if guard.violations:
            raise forbidden_call(guard.violations[0], exercise) from None
        return Outcome(error=(type(error).__name__, str(error))), error
    if guard.violations:
        raise forbidden_call(guard.violations[0], exercise)
    return Outcome(value=value, mutated=mutated_arguments(originals, kw_originals, args, kwargs)), None
