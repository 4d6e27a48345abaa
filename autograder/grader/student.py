"""Call the student's code from a check so that whatever it does becomes a message for the student.

Where the student's code runs in this process (the student's own notebook, the tests), a call is made
here (:mod:`autograder.kernel.call`); when a notebook is graded, the student's objects are proxies
(:mod:`autograder.grader.remote`) and each call is made in the student's kernel. The rules of a call
(the built-ins its exercise forbids, and the exercise's name) are passed with it: to the kernel with
each request, and to the student's objects a harness of the check runs (:class:`Harness`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from ..kernel.call import Outcome, guarded_call, student_frames
from ..kernel.guard import Forbidden
from ..shared.errors import fail
from ..shared.wire import Proxy
from .cases import case


def attempt(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict | None = None,
    *,
    exercise: str,
    forbid: Sequence[Forbidden] = (),
) -> tuple[Outcome, BaseException | None]:
    """Run the student's ``fn`` under a guard; return its outcome and the exception, if any.

    A forbidden call or an unwritten exercise stops the check at once with its message. A
    :class:`~autograder.grader.remote.Remote` function (grading) is run in the student's kernel; a
    function of this process is run here (:func:`~autograder.kernel.call.guarded_call`), and the
    student's objects it runs (a :class:`Harness`'s, and its arguments) are called under the same rules.
    """
    if isinstance(fn, Proxy):
        return fn.attempt(tuple(args), dict(kwargs or {}), exercise=exercise, forbid=forbid)
    fn, args = under(fn, forbid, exercise), tuple(under(a, forbid, exercise) for a in args)
    kwargs = {k: under(v, forbid, exercise) for k, v in (kwargs or {}).items()}
    return guarded_call(fn, args, kwargs, exercise=exercise, forbid=forbid)


def under(obj: Any, forbid: Sequence[Forbidden], exercise: str) -> Any:
    """``obj`` called as part of ``exercise`` under ``forbid``: a student's object in the kernel as a proxy whose calls
    (and those of every object reached from it) carry the rules, a :class:`Harness` with its objects so; anything
    else as it is."""
    return obj.under(tuple(forbid), exercise) if isinstance(obj, Proxy | Harness) else obj


class Harness:
    """How a check runs the student's objects: ``build(*objects)`` makes the function the check calls.

    A check that runs the student's code through code of its own (a module built from the student's
    class, a cache fed in steps) hands :func:`attempt` a harness rather than a closure, so that the
    student's objects it holds run under the rules of that call (:meth:`under`). Called directly (a
    catalogued mistake run the same way), it runs ``build(*objects)`` as it is.
    """

    def __init__(self, build: Callable[..., Callable[..., Any]], objects: tuple) -> None:
        self.build, self.objects = build, objects

    def under(self, forbid: Sequence[Forbidden], exercise: str) -> Callable[..., Any]:
        """The function the check calls, with the student's objects called under ``forbid`` as ``exercise``."""
        return self.build(*(under(o, forbid, exercise) for o in self.objects))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.build(*self.objects)(*args, **kwargs)


def harness(build: Callable[..., Callable[..., Any]]) -> Callable[..., Harness]:
    """Make ``build(*objects) -> function`` (how a check runs the student's objects) return a :class:`Harness`."""
    @functools.wraps(build)
    def made(*objects: Any) -> Harness:
        return Harness(build, objects)
    return made


def served_to(fn: Callable[..., Any], obj: Any, methods: tuple[str, ...] = ("__call__",)) -> Any:
    """``obj`` as an argument of ``fn``: where ``fn`` runs in the student's kernel, a stand-in whose calls
    (``methods``) the grader makes on ``obj`` and so counts itself (:mod:`autograder.kernel.served`); else ``obj``."""
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

    A case of its own in a hidden check (:mod:`autograder.grader.cases`), worth ``weight`` shares; returns
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
    (:func:`autograder.kernel.serve.hold_probes`). A probe whose result is a property seen there
    (:data:`autograder.kernel.probe_kinds.OBSERVED`) is preceded by the grader's reading of the
    student's source, so that nothing loaded changes what it calls (a "cannot verify" fails the
    call); a probe whose result is data is judged against a reference, however it was computed.
    """
    if isinstance(target, Proxy):
        return target.probe(examine, args, kwargs, what=what, forbid=forbid)
    return call_student(examine, target, *args, what=what, forbid=forbid, **kwargs)
