"""Call the student's code so that whatever it does becomes a message for the student."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cases import case
from .diagnosis import Outcome, copy_argument, mutated_arguments
from .errors import CheckFailed, NotWritten, fail
from .guard import ACTIVE_RULES, Forbidden, Guard, forbidden_call
from .wire import Proxy

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_TORCH_MARKERS = ("/torch/", "\\torch\\")


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


def attempt(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict | None = None,
    *,
    exercise: str,
    forbid: Sequence[Forbidden] = (),
) -> tuple[Outcome, BaseException | None]:
    """Run the student's ``fn`` under a guard; return its outcome and the exception, if any.

    A forbidden call or an unwritten exercise stops the check at once with its message.
    A :class:`~autograder.remote.Remote` function (grading) is run in the student's kernel.
    """
    if isinstance(fn, Proxy):
        return fn.attempt(tuple(args), dict(kwargs or {}), exercise=exercise, forbid=forbid)
    guard = Guard(tuple(forbid), exercise)
    # The student's function gets copies: changing its inputs in place must not change
    # the inputs the reference is computed from (and the copies show whether it did).
    originals, kw_originals = tuple(args), dict(kwargs or {})
    args = tuple(copy_argument(a) for a in originals)
    kwargs = {k: copy_argument(v) for k, v in kw_originals.items()}
    active = ACTIVE_RULES.set((tuple(forbid), exercise))
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
    finally:
        ACTIVE_RULES.reset(active)
    if guard.violations:
        raise forbidden_call(guard.violations[0], exercise)
    return Outcome(value=value, mutated=mutated_arguments(originals, kw_originals, args, kwargs)), None


def served_to(fn: Callable[..., Any], obj: Any, methods: tuple[str, ...] = ("__call__",)) -> Any:
    """``obj`` as an argument of ``fn``: where ``fn`` runs in the student's kernel, a stand-in whose calls
    (``methods``) the grader makes on ``obj`` and so counts itself (:mod:`autograder.served`); else ``obj``."""
    return fn.serve(obj, methods) if isinstance(fn, Proxy) else obj


def describe_error(what: str, error: BaseException) -> str:
    """``what`` raised ``error``, with the student's own traceback lines."""
    where = student_frames(error)
    return f"{what} raised {type(error).__name__}: {error}" + (f"\nIn your code:\n{where}" if where else "")


def call_student(
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    forbid: Sequence[Forbidden] = (),
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` under a guard and return its value.

    Any exception the student's code raises becomes a :class:`CheckFailed` naming
    ``what`` was called, the exception, and the student's own lines of the traceback.
    """
    outcome, error = attempt(fn, args, kwargs, exercise=what.split("(", 1)[0], forbid=forbid)
    if error is not None:
        fail(describe_error(what, error))
    return outcome.value


def expect_error(
    fn: Callable[..., Any],
    *args: Any,
    error: type[BaseException],
    what: str,
    why: str,
    weight: float = 1.0,
    **kwargs: Any,
) -> BaseException | None:
    """Fail unless ``fn(*args)`` raises ``error`` (for example ``ValueError`` on bad shapes).

    A case of its own in a hidden check (:mod:`autograder.cases`), worth ``weight`` shares; returns
    the error raised (None when the case failed and the check went on).
    """
    raised = None
    with case(f"{what} raises {error.__name__}", weight):
        outcome, raised = attempt(fn, args, kwargs, exercise=what.split("(", 1)[0])
        if raised is None:
            fail(f"{what} should raise {error.__name__} because {why}, but it returned without an error.")
        if not isinstance(raised, error):
            fail(f"{what} should raise {error.__name__} because {why}, but it raised {type(raised).__name__}: {raised}")
    return raised if isinstance(raised, error) else None


def probe(
    examine: Callable[..., Any],
    target: Any,
    *args: Any,
    what: str,
    forbid: Sequence[Forbidden] = (),
    **kwargs: Any,
) -> Any:
    """``examine(target, *args, **kwargs)`` run where the student's code runs; its plain-data result.

    ``examine`` is a module-level function of the package's public part (never its
    instructor-only part) that looks at the student's object in the student's own process
    (autograd through it, its parameters, a watch on the torch calls it makes) and returns
    plain data. When a notebook is graded, ``target`` lives in the sandboxed kernel and so
    does this call, with the probe copied before any answer cell was loaded
    (:func:`autograder.serve.hold_probes`): the student's code can still change what a probe
    returns by changing what it calls, as it can change what its functions return, but never
    how the result is judged.
    """
    if isinstance(target, Proxy):
        return target.probe(examine, args, kwargs, what=what, forbid=forbid)
    return call_student(examine, target, *args, what=what, forbid=forbid, **kwargs)
