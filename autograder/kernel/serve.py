"""The kernel's side of grading: the student's kernel answers the grader's requests.

When a notebook is graded, the checks run in the grader's process (:mod:`autograder.grader.remote`, the
grader's side) and send each call of a student's function here, as plain data (:mod:`autograder.shared.wire`):
:func:`serve` calls the function under the guard (:mod:`autograder.kernel.call`), keeps what is not plain
data under a number (a :class:`~autograder.shared.wire.Handle`), and answers with the value or the error.
The grader's side never imports this module (but :mod:`autograder.grader.local_channel`, which puts both
sides in one process for the tests), and nothing of the kernel's side (:mod:`autograder.kernel`) imports
the grader's: the boundary that grading's security rests on is a boundary in the code too.

The probes a check runs here (:func:`autograder.grader.student.probe`) are *held*: in the graded kernel,
before any answer cell is loaded, :func:`hold_probes` copies every function of the modules that
define probes (:data:`PROBE_MODULES`), each copy with its own copy of its module's names, and
:func:`serve` runs the copies. An answer cell that replaces a probe afterwards (an assignment or
``setattr`` on its module, however the module is reached; a new ``__code__`` on the function; another
module put in ``sys.modules``) changes the original, not the copy that runs; the copies read Python's
built-ins as they were at the hold.

Each probe says what its result is (:data:`autograder.kernel.probe_kinds.PROBE_KINDS`): data the grader judges
against a reference, or a property seen here, with what in the grader backs it (08's gradcheck, once a probe, is
data compared in the grader; before a probe that observes, the grader reads the student's source).

A check that must know how the student's code calls a model (how many calls, with what) does not
count in the kernel: it serves the model from the grader (:mod:`autograder.kernel.served`), and :func:`serve`
lets the stand-in's calls reach the grader as input requests while a request runs.

What this does not protect: everything here runs in the student's kernel, beside the student's
code, which can replace it. The held copies are reachable too (through this module, or the garbage
collector), and what they call is not held: the classes of their modules (a watch's methods), the
modules they import (PyTorch, the guard), this module's own functions. Code written to find and
replace those still changes what a probe reports. Its answers are plain data, judged in the grader; what it measures about
how an answer was computed (the guard, the probes' watches) helps honest students and is backed by
the grader's reading of the source (:mod:`autograder.engine.source_check`) and, for the memory of a
call, by the grader's reading of the kernel's control group (:meth:`autograder.grader.remote.Remote.measured_attempt`).
"""

from __future__ import annotations

import base64
import builtins
import importlib
import os
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

from .. import INSTRUCTOR_ONLY
from ..shared import wire
from ..shared.errors import CheckFailed, NotWritten
from .call import guarded_call, student_frames
from .guard import Forbidden, ForbiddenCall
from .served import TRANSPORT, ServedObject

_objects: dict[int, Any] = {}

#: The modules whose functions are the checks' probes (``probe(examine, ...)``); tests/checks/test_probes.py
#: derives the probes from the checks' code and fails when one's module is missing here.
PROBE_MODULES = (
    "autograder.kernel.watches",
    "autograder.checks.decoding_and_training",
    "autograder.checks.masking",
    "autograder.checks.serving",
    "autograder.references.decoding_and_training",
    "autograder.references.flash_backward",
    "autograder.references.long_context",
    "autograder.references.masking",
    "autograder.references.multi_head",
    "autograder.references.numerical_stability",
    "autograder.references.serving",
    "autograder.references.tiny_decoder",
)
_held: dict[str, Callable[..., Any]] = {}


def _copies(name: str, made: dict[str, dict]) -> dict:
    """A copy of module ``name``'s names in which each function of the package is a copy bound to such names,
    and to Python's built-ins as they are now (``made[""]``): replacing ``builtins.range`` later changes neither."""
    if name in made:
        return made[name]
    names = made[name] = dict(vars(importlib.import_module(name)))  # before the copies: a cycle finds it
    names["__builtins__"] = made.setdefault("", dict(vars(builtins)))
    for key, value in list(names.items()):
        module = getattr(value, "__module__", "") or ""
        if isinstance(value, types.FunctionType) and module.split(".")[0] == "autograder" and \
                (module == name or module in PROBE_MODULES) and \
                value.__globals__ is vars(importlib.import_module(module)):  # a wrapper made elsewhere stays as is
            own = names if module == name else _copies(module, made)
            held = types.FunctionType(value.__code__, own, value.__name__, value.__defaults__, value.__closure__)
            held.__kwdefaults__ = dict(value.__kwdefaults__) if value.__kwdefaults__ else None
            held.__qualname__, held.__module__ = value.__qualname__, module
            names[key] = held
    return names


def hold_probes(modules: Sequence[str] | None = None) -> None:
    """Copy every probe, as it is now, for :func:`serve` to run (the grader calls it before any answer cell).

    ``modules``: the package's modules the notebook's checks reach (None: all); only the probes of
    those are held, so that the kernel imports no module the checks do not need.
    """
    made: dict[str, dict] = {}
    for name in PROBE_MODULES if modules is None else [m for m in PROBE_MODULES if m in modules]:
        for value in _copies(name, made).values():
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                _held.setdefault(f"{name}:{value.__qualname__}", value)


def _keep(obj: Any) -> wire.Handle:
    number = len(_objects) + 1
    _objects[number] = obj
    kind = type(obj).__name__
    return wire.Handle(number, kind[:200], callable(obj))


def _error_info(error: BaseException) -> dict:
    bases = [c.__name__ for c in type(error).__mro__ if getattr(builtins, c.__name__, None) is c]
    return {"type": type(error).__name__, "bases": bases, "message": str(error)[:20000],
            "frames": student_frames(error)[:5000]}


def _examiner(name: str) -> Callable[..., Any]:
    if _held:  # the graded kernel: only the copies made before the answer cells were loaded
        if name not in _held:
            raise ValueError(f"{name} is not a probe of the public checks")
        return _held[name]
    module, _, qualname = name.partition(":")
    parts = module.split(".")
    if parts[0] != "autograder" or (len(parts) > 1 and parts[1] in INSTRUCTOR_ONLY):
        raise ValueError(f"{name} is not a probe of the public checks")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _running_children() -> int:
    """How many processes descend from this one (a child, its children, ...)."""
    if hasattr(os, "waitid"):  # not on Windows, nor macOS
        try:  # asks the kernel about this process's own children, reaping none of them
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return 0  # no child at all: nothing descends (psutil would read every process of the machine to say so)
        except OSError:
            pass
    try:
        import psutil
    except ImportError:  # the student's own environment may lack it; grading's has it
        return 0
    return len(psutil.Process().children(recursive=True))


def _called(request: dict) -> dict:
    rules = tuple(Forbidden(shown, frozenset(names), family) for shown, names, family in request.get("forbid", []))
    target = request["target"]
    args, kwargs, exercise = tuple(request.get("args", ())), dict(request.get("kwargs", {})), request.get("exercise", "")
    if request["op"] == "probe":
        args, target = (target, *args), _examiner(request["examine"])
    threads, children = threading.active_count(), _running_children()
    try:
        outcome, error = guarded_call(target, args, kwargs, exercise=exercise, forbid=rules)
    except ForbiddenCall as failure:
        return {"failed": str(failure), "forbidden": failure.builtin}
    except NotWritten as failure:
        return {"failed": str(failure), "unwritten": True}
    except CheckFailed as failure:
        return {"failed": str(failure)}
    if threading.active_count() > threads or _running_children() > children:
        return {"failed": f"{exercise} started a thread or a process that was still running when it returned. "
                          "Grading runs your function on its own: compute the result in the function's own thread."}
    if error is not None:
        return {"error": _error_info(error)}
    return {"value": outcome.value, "mutated": list(outcome.mutated)}


def _answer(request: Any, namespace: dict) -> dict:
    op = request.get("op") if isinstance(request, dict) else None
    if op == "reset":
        _objects.clear()
        return {"value": None}
    if op == "name":
        name = request["name"]
        return {"value": namespace[name]} if name in namespace else {"undefined": True}
    if op in ("call", "probe"):
        return _called(request)
    if op == "getattr":
        try:
            return {"value": getattr(request["target"], request["name"])}
        except Exception as error:  # noqa: BLE001 - reported to the check
            return {"error": _error_info(error)}
    if op == "len":
        try:
            return {"value": len(request["target"])}
        except Exception as error:  # noqa: BLE001 - reported to the check
            return {"error": _error_info(error)}
    return {"failed": f"unknown request {op!r}"}


class _Reply(str):
    """The encoded reply; shown as itself (no quotes) where the kernel formats it."""

    def __repr__(self) -> str:
        return str.__str__(self)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str.__str__(self))


def serve(request: str, namespace: dict | None = None) -> _Reply:
    """Answer one encoded request of the grader (base64 text in, base64 text out)."""
    token = None
    if namespace is None:
        from IPython import get_ipython

        shell = get_ipython()
        namespace = shell.user_ns
        kernel = getattr(shell, "kernel", None)
        if kernel is not None and TRANSPORT.get() is None:
            # a served object's calls go to the grader as input requests (the request allows stdin; ipykernel has
            # already put back the built-in input() when it evaluates the request's expression: ask the kernel)
            token = TRANSPORT.set(lambda text: kernel.raw_input(wire.SERVED_PROMPT + text))
    try:
        answer = _answer(wire.decode(base64.b64decode(request), resolve=lambda n, k, c: _objects[n],
                                     served=ServedObject), namespace)
    except Exception as error:  # noqa: BLE001 - every failure is an answer
        answer = {"failed": f"the request could not be answered ({type(error).__name__}: {error})"}
    finally:
        if token is not None:
            TRANSPORT.reset(token)
    try:
        data = wire.encode(answer, keep=_keep)
    except (wire.WireError, RecursionError) as error:
        data = wire.encode({"unsendable": str(error)[:500]})
    return _Reply(base64.b64encode(data).decode("ascii"))
