"""The student's objects seen from the grader: proxies whose calls run in the student's kernel.

When a notebook is graded, its test cells run in the grader's process, not in the kernel
that ran the student's cells. A name a test cell reads from the student's notebook
(``check_soft_lookup(soft_lookup)``) becomes a :class:`Remote`: calling it sends the
arguments, as plain data (:mod:`autograder.shared.wire`), to the kernel, where :func:`serve` calls
the student's function under the guard and sends back what it returned, or the error it
raised. References, expected values, comparisons and the mistake catalogue never enter the
kernel, so nothing the student's code does there can change how its results are judged.

This module is the grader's side, over a :class:`Channel`; the kernel's side is
:mod:`autograder.kernel.serve`, which this module does not import. A student's code can replace
:func:`~autograder.kernel.serve.serve` in its own kernel; what it sends back is then still only plain
data, judged like any other answer.

Each call carries its rules (the built-ins its exercise forbids, and the exercise it is part of) in the
request. A check's call passes them (:func:`autograder.grader.student.attempt`); a :class:`Remote` the
check calls through code of its own (a harness) holds them (:meth:`Remote.under`), and so does every
object reached from it. One called with none is its own exercise, with nothing forbidden.

What this does not protect: what runs in the kernel is the student's. The guard against
forbidden built-ins, the watches of probes and the thread check below all run there and can
be fooled by code written to fool them (the probes are held, :func:`autograder.kernel.serve.hold_probes`,
against an answer cell that replaces one, not against code that replaces what they call); the
grader adds a reading of the student's source (:mod:`autograder.engine.source_check`) that the kernel
cannot change, before every call of an exercise that forbids built-ins and before every probe that
observes the code in the kernel (:data:`autograder.kernel.probe_kinds.OBSERVED`), and
measures a call's memory from outside the kernel where the channel can
(:meth:`Remote.measured_attempt`: the call made in a fresh kernel loaded as the graded one, its
control group's peak during the call above what it held before the answer cells were loaded).
"""

from __future__ import annotations

import base64
import builtins
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..kernel.call import Outcome
from ..kernel.guard import Forbidden, ForbiddenCall
from ..kernel.probe_kinds import OBSERVED, PROBE_KINDS
from ..shared import wire
from ..shared.errors import CheckFailed, NotWritten, OutOfTime, fail
from .student import describe_error


class Interrupted(BaseException):
    """The kernel stopped answering a request (a ``BaseException``: no check may swallow it)."""


class CallTimedOut(Interrupted, OutOfTime):
    """A request ran past the time its test cell had left."""


class KernelDied(Interrupted):
    """The kernel process ended while a request ran."""


class Channel(Protocol):
    """How requests reach the student's kernel."""

    def request(self, message: bytes) -> bytes:
        """Send one encoded request; return the encoded reply (raises :class:`Interrupted`)."""

    def forbidden_use(self, name: str, rules: Sequence[Forbidden], exercise: str) -> str | None:
        """What of ``rules`` the student's source of ``name`` uses, as a message (None: nothing)."""


def _measured_request(channel: Channel) -> Callable[[dict, str], tuple[bytes, int | None]] | None:
    """The channel's way to make a call and measure the kernel's memory during it, where it has one.

    A channel to a kernel in a control group (:class:`~autograder.engine.execute.ResilientExecute`)
    has one: ``measures_memory()`` and ``measured_request(request, name) -> (reply, bytes or None)``,
    which makes the call ``request`` (not yet encoded) on the object the notebook names ``name``, in a
    kernel of its own; other channels (a namespace in this process, a kernel without a group) have none.
    """
    measures = getattr(channel, "measures_memory", None)
    if measures is None or not measures():
        return None
    return channel.measured_request


# -- the grader's side -------------------------------------------------------------------------


def _student_error(info: Any) -> Exception:
    """The exception a student's code raised, rebuilt from its description (a built-in base class)."""
    if not isinstance(info, dict):
        info = {}
    name = str(info.get("type", "Exception"))
    name = name if name.isidentifier() and len(name) <= 100 else "Exception"
    message = str(info.get("message", ""))[:20000]
    base: type[Exception] = RuntimeError
    for candidate in info.get("bases", []) if isinstance(info.get("bases"), list) else []:
        found = getattr(builtins, str(candidate), None)
        if isinstance(found, type) and issubclass(found, Exception):
            base = found
            break
    try:
        error = type(name, (base,), {"__module__": "student"})(message)
    except Exception:  # noqa: BLE001 - a base whose constructor wants more arguments
        error = type(name, (RuntimeError,), {"__module__": "student"})(message)
    error.student_frames = str(info.get("frames", ""))[:5000]
    return error


class Remote(wire.Proxy):
    """A student's object in the kernel: call it, read a public attribute, take its ``len``."""

    def __init__(self, channel: Channel, number: int, kind: str, is_callable: bool, root: str,
                 named: bool = False, rules: tuple[tuple[Forbidden, ...], str] | None = None) -> None:
        self._channel, self._number, self._kind, self._callable, self._root = channel, number, kind, is_callable, root
        self._named = named  # the object the notebook names ``root`` itself (not one reached from it)
        # what its calls are part of: the built-ins forbidden, and the exercise named (by default, its own name)
        self._rules = rules if rules is not None else ((), root)

    def under(self, forbid: tuple[Forbidden, ...], exercise: str) -> Remote:
        """This object, whose calls (and those of the objects reached from it) are part of ``exercise`` under ``forbid``."""
        return Remote(self._channel, self._number, self._kind, self._callable, self._root, self._named,
                      (tuple(forbid), exercise))

    @property
    def description(self) -> str:
        """What the object is, in words, for a message."""
        return f"a {self._kind}"

    def __repr__(self) -> str:
        return f"<your {self._kind}>"

    def __wire_handle__(self) -> wire.Handle:
        """How :mod:`autograder.shared.wire` sends this object back to the kernel: by its number there."""
        return wire.Handle(self._number)

    def serve(self, obj: Any, methods: tuple[str, ...]) -> wire.Served:
        """``obj`` kept in this process for this object's calls (:func:`served`): the grader counts its calls."""
        return served(obj, methods)

    def _ask(self, request: dict, measured: list[int | None] | None = None) -> dict:
        resolve = self._resolver()
        if measured is None:
            reply = self._channel.request(wire.encode(request))
        else:  # the caller made sure the channel measures; the call ran in a kernel of its own, gone now
            reply, peak = self._channel.measured_request(request, self._root)
            measured.append(peak)
            resolve = _gone
        try:
            decoded = wire.decode(reply, resolve=resolve, limit=wire.MAX_REPLY_BYTES)
        except wire.WireError as error:
            fail(f"What your code sent back could not be read: {error}.")
        if not isinstance(decoded, dict):
            fail("What your code sent back could not be read.")
        if "unsendable" in decoded:
            fail(f"Your code returned something that is not plain data ({decoded['unsendable']}): return tensors, "
                 "numbers or tuples of them.")
        return decoded

    def _resolver(self) -> Callable[[int, str, bool], Remote]:
        return lambda number, kind, is_callable: Remote(self._channel, number, kind, is_callable, self._root,
                                                        rules=self._rules)

    def _checked(self, forbid: Sequence[Forbidden], exercise: str, observes: bool = False) -> None:
        """Read the student's source before a call: for the built-ins ``forbid`` names, and, before a probe that
        ``observes`` what the code does in the kernel, for anything that could change what the probe relies on
        (the reader's rules with nothing forbidden: no module changed, no dynamic lookups, no evasions)."""
        if not forbid:
            problem = self._channel.forbidden_use(self._root, (), self._root) if observes else None
            if problem:  # what the probe observes is not backed: its case fails, not the whole cell
                fail(problem)
            return
        problem = self._channel.forbidden_use(self._root, forbid, exercise)
        if problem:
            # Which built-in: the rule that alone finds the same use; none when the code gets round the guard
            # (found with no rule at all).
            rules = [] if self._channel.forbidden_use(self._root, (), exercise) == problem else forbid
            builtin = next((r.shown_as for r in rules
                            if self._channel.forbidden_use(self._root, (r,), exercise) == problem), None)
            raise ForbiddenCall(problem, builtin)

    def _call(self, op: dict, args: Sequence[Any], kwargs: dict, exercise: str, forbid: Sequence[Forbidden],
              measured: list[int | None] | None = None, observes: bool = False) -> dict:
        self._checked(forbid, exercise, observes)
        request = dict(op, target=self.__wire_handle__(), args=tuple(args), kwargs=dict(kwargs), exercise=exercise,
                       forbid=[[r.shown_as, sorted(r.names), r.family] for r in forbid])
        reply = self._ask(request, measured)
        if "failed" in reply:
            if "forbidden" in reply:  # the guard stopped a call in the kernel
                builtin = reply["forbidden"]
                raise ForbiddenCall(str(reply["failed"]), builtin if type(builtin) is str else None)
            if reply.get("unwritten") is True:
                raise NotWritten(str(reply["failed"]))
            raise CheckFailed(str(reply["failed"]))
        return reply

    def attempt(self, args: Sequence[Any], kwargs: dict, *, exercise: str, forbid: Sequence[Forbidden] = ()
                ) -> tuple[Any, BaseException | None]:
        """:func:`autograder.grader.student.attempt` of this object, run in the kernel."""
        return self._outcome(self._call({"op": "call"}, args, kwargs, exercise, forbid))

    @staticmethod
    def _outcome(reply: dict) -> tuple[Any, BaseException | None]:
        if "error" in reply:
            error = _student_error(reply["error"])
            return Outcome(error=(type(error).__name__, str(error))), error
        mutated = reply.get("mutated", [])
        mutated = tuple(m for m in mutated if type(m) in (int, str)) if isinstance(mutated, list) else ()
        return Outcome(value=reply.get("value"), mutated=mutated), None

    def measures_memory(self) -> bool:
        """Whether :meth:`measured_attempt` can measure the kernel's memory from outside it (a named object's)."""
        return self._named and _measured_request(self._channel) is not None

    def measured_attempt(self, args: Sequence[Any], kwargs: dict, *, exercise: str, forbid: Sequence[Forbidden] = ()
                         ) -> tuple[Any, BaseException | None, int | None]:
        """:meth:`attempt`, and the memory the call took, read from the control group of the kernel it ran in.

        The call runs in a fresh kernel that holds what the graded kernel holds; the figure is the
        highest that kernel's memory reached during the whole request (reading the arguments, the
        call, writing the answer) above what it held before the answer cells were loaded, so memory
        an answer cell holds counts. None, and no call made, where the channel cannot measure
        (:meth:`measures_memory`) or an argument is an object of the student's (it lives in the
        graded kernel only).
        """
        if not self.measures_memory() or any(isinstance(a, wire.Proxy) for a in (*args, *kwargs.values())):
            return None, None, None
        measured: list[int | None] = []
        reply = self._call({"op": "call"}, args, kwargs, exercise, forbid, measured)
        outcome, error = self._outcome(reply)
        return outcome, error, measured[0] if measured else None

    def probe(self, examine: Callable[..., Any], args: Sequence[Any], kwargs: dict, *, what: str,
              forbid: Sequence[Forbidden] = ()) -> Any:
        """:func:`autograder.grader.student.probe` with this object as the target, run in the kernel."""
        name = f"{examine.__module__}:{examine.__qualname__}"
        observes = PROBE_KINDS.get(name, (OBSERVED,))[0] == OBSERVED  # a probe not classified is read too
        reply = self._call({"op": "probe", "examine": name}, args, kwargs, what.split("(", 1)[0], forbid,
                           observes=observes)
        if "error" in reply:
            fail(describe_error(what, _student_error(reply["error"])))
        return reply.get("value")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forbid, exercise = self._rules
        outcome, error = self.attempt(args, kwargs, exercise=exercise or self._root, forbid=forbid)
        if error is not None:
            raise error
        return outcome.value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        reply = self._ask({"op": "getattr", "target": self.__wire_handle__(), "name": name})
        if "error" in reply:
            raise AttributeError(f"{self._kind} has no attribute {name!r}")
        return reply.get("value")

    def __len__(self) -> int:
        reply = self._ask({"op": "len", "target": self.__wire_handle__()})
        if "error" in reply:
            raise _student_error(reply["error"])
        value = reply.get("value")
        if type(value) is not int or value < 0:
            raise TypeError(f"len() of {self.description} is not a non-negative int")
        return value


def _gone(number: int, kind: str, is_callable: bool) -> Any:
    raise wire.WireError(f"a {kind} that is not plain data (return tensors, numbers or tuples of them)")


def lookup(channel: Channel, name: str) -> tuple[bool, Any]:
    """``(True, value)`` for a name the student's notebook defines (a :class:`Remote` or plain data), else ``(False, None)``.

    Raises :class:`~autograder.shared.errors.CheckFailed` when the kernel's answer cannot be read.
    """
    resolver = lambda number, kind, is_callable: Remote(channel, number, kind, is_callable, name, True)  # noqa: E731
    try:
        reply = wire.decode(channel.request(wire.encode({"op": "name", "name": name})), resolve=resolver,
                            limit=wire.MAX_REPLY_BYTES)
    except wire.WireError as error:
        fail(f"The kernel's answer, when the check asked for {name}, could not be read ({error}).")
    if isinstance(reply, dict) and reply.get("undefined") is True:
        return False, None
    if not isinstance(reply, dict) or "value" not in reply:
        fail(str(reply.get("failed")) if isinstance(reply, dict) and "failed" in reply else
             f"The kernel's answer, when the check asked for {name}, could not be read.")
    return True, reply["value"]


def reset(channel: Channel) -> None:
    """Let the kernel forget the objects earlier requests kept, and this process the objects it served."""
    _served.clear()
    channel.request(wire.encode({"op": "reset"}))


#: The objects this process keeps for the kernel (:mod:`autograder.kernel.served`): number -> (object, methods allowed).
_served: dict[int, tuple[Any, frozenset[str]]] = {}


def served(obj: Any, methods: Sequence[str] = ("__call__",)) -> wire.Served:
    """``obj`` kept here for the kernel, which may call ``methods`` of it (``"__call__"``: the object itself)."""
    for number, (kept, _) in _served.items():
        if kept is obj:
            return wire.Served(number)
    number = len(_served) + 1
    _served[number] = (obj, frozenset(methods))
    return wire.Served(number)


def answer_served(text: str) -> str:
    """The answer to a kernel's request for a served object's call (base64 text in and out).

    The call is made here, on the object this process keeps; its result goes back as plain data, or
    as another served object (no method allowed: the kernel can only pass it back) when it is not
    plain data. Whatever the request, the answer is an error or a value: it never stops the check.
    """
    if len(text) > (wire.MAX_REPLY_BYTES + 12) * 4 // 3 + 4:
        return _encoded({"error": "the request to the model is too large"})
    try:
        request = wire.decode(base64.b64decode(text, validate=True), served=_served_object,
                              limit=wire.MAX_REPLY_BYTES)
        number, method = request["object"], request["method"]
        obj, methods = _served[number]
        args, kwargs = tuple(request["args"]), dict(request["kwargs"])
    except Exception:  # noqa: BLE001 - a malformed request is the kernel's doing
        return _encoded({"error": "the request to the model could not be read"})
    if type(method) is not str or method not in methods:
        return _encoded({"error": f"this object has no method {str(method)[:100]!r} that the check allows"})
    try:
        value = (obj if method == "__call__" else getattr(obj, method))(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the student's call was wrong: their code gets the error
        return _encoded({"error": f"{type(error).__name__}: {error}"[:2000]})
    try:
        return _encoded({"value": value})
    except (wire.WireError, RecursionError):
        return _encoded({"value": served(value, methods=())})


def _served_object(number: int) -> Any:
    return _served[number][0]


def _encoded(answer: dict) -> str:
    return base64.b64encode(wire.encode(answer)).decode("ascii")
