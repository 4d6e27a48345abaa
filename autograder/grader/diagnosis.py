"""Name the mistake a wrong answer makes.

Each exercise has a catalogue of :class:`Mistake`\\ s: a name, an explanation, the
section of the notebook that teaches the right idea, and an implementation that makes
exactly that mistake. A wrong answer is run on the same input as every mistake in the
catalogue; the mistakes that produce the same result (or raise the same error) are named
in the message, all of them when several give that result. When none does, pairs of
mistakes declared as variations of one reference (:mod:`autograder.grader.variation`) are tried,
within :data:`PAIR_BUDGET` and once a judged check, and the first pair that gives the result is named.

The catalogue is instructor-only: the grader has it, the student's bundle does not.
:func:`catalogue` finds it when it is there, so that the visible checks name catalogued
mistakes at grading time, while in the bundle only the generic diagnoses of
:mod:`autograder.grader.diagnoses` speak.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..kernel.call import Outcome, copy_argument, mutated_arguments
from ..kernel.guard import Forbidden, ForbiddenCall, Guard
from ..shared.errors import CheckFailed
from .cases import first_pair_search
from .compare import is_close
from .variation import combined, wrapping


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to solve an exercise.

    ``id`` names it for the grading pipeline, never for the student: stable when its words
    change, unique in the course (``<notebook>/<exercise>/<slug>``), the same for several
    implementations of one mistake.
    """

    name: str
    explanation: str
    section: str
    fn: Callable[..., Any]
    id: str = ""
    #: The catalogued mistakes this one makes at once (:func:`together`); empty for a catalogued mistake.
    parts: tuple[Mistake, ...] = ()

    def message(self) -> str:
        """The paragraph a student reads when their answer makes this mistake."""
        if self.parts:
            first, second = self.parts
            return (f"This looks like two mistakes at once. The mistake '{first.name}': {first.explanation} "
                    f"Section '{first.section}' of this notebook explains it. And the mistake '{second.name}': "
                    f"{second.explanation} Section '{second.section}' explains it.")
        return (
            f"This looks like the mistake '{self.name}': {self.explanation} "
            f"Section '{self.section}' of this notebook explains it."
        )


#: The most pairs of catalogued mistakes tried on one failing answer when no single mistake fits it: each costs
#: one more call like a mistake's (a count, not a time, so that a verdict never depends on the machine's speed).
PAIR_BUDGET = 40


@functools.cache
def together(first: Mistake, second: Mistake) -> Mistake | None:
    """The two mistakes made at once, when both are variations of one reference's different decisions; else None."""
    both = combined(first.fn, second.fn)
    if both is None:
        return None
    return Mistake(f"{first.name} and {second.name}", f"{first.explanation} {second.explanation}", first.section,
                   both, f"{first.id}+{second.id}", (first, second))


def pairs(mistakes: Sequence[Mistake], budget: int | None = None) -> list[Mistake]:
    """The first ``budget`` (default :data:`PAIR_BUDGET`) pairs of ``mistakes`` that can be made at once, in order."""
    budget = PAIR_BUDGET if budget is None else budget
    found: list[Mistake] = []
    for first, second in itertools.combinations(mistakes, 2):
        if len(found) == budget:
            break
        pair = together(first, second) if not _same_mistake(first, second) else None
        if pair is not None:
            found.append(pair)
    return found


class MistakeFound(CheckFailed):
    """A failure whose answer is what catalogued mistakes give: the message names them.

    The grader records their ids (:mod:`autograder.engine.judge`), so that the class report
    counts mistakes by id, never by the words of a message.
    """

    def __init__(self, problem: str, mistakes: Sequence[Mistake]) -> None:
        self.mistakes = tuple(mistakes)
        super().__init__(f"{problem}\n{name_mistakes(self.mistakes)}" if self.mistakes else problem)


#: The error type of a mistake that called a built-in its exercise forbids.
FORBIDDEN = ForbiddenCall.__name__


def run(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None,
        forbid: Sequence[Forbidden] = ()) -> Outcome:
    """Call ``fn`` on copies of the tensor arguments; record its result or its error and what it changed in place.

    Never raises, and never changes ``args``: a mistake that works in place must not change
    the inputs the next mistake, or the next case, is run on. Under ``forbid``, a call of a
    forbidden built-in is recorded as the error :data:`FORBIDDEN`.
    """
    kwargs = kwargs or {}
    copies, kw_copies = [copy_argument(a) for a in args], {k: copy_argument(v) for k, v in kwargs.items()}
    guard = Guard(tuple(forbid), "a catalogued mistake")
    try:
        with guard if forbid else contextlib.nullcontext():
            value = fn(*copies, **kw_copies)
    except Exception as error:  # noqa: BLE001 - a mistake may fail, that is its signature
        return Outcome(error=(FORBIDDEN if guard.violations else type(error).__name__, str(error)))
    if guard.violations:
        return Outcome(error=(FORBIDDEN, guard.violations[0]))
    return Outcome(value=value, mutated=mutated_arguments(args, kwargs, copies, kw_copies))


def matching(
    student: Outcome,
    mistakes: Sequence[Mistake],
    args: Sequence[Any],
    kwargs: dict | None = None,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    same_mutation: bool = False,
    right: Callable[[Any], bool] | None = None,
    forbid: Sequence[Forbidden] = (),
    same: Callable[[Any, Any], bool] | None = None,
) -> list[Mistake]:
    """Every mistake whose outcome on ``args`` equals the student's, one per mistake, in catalogue order.

    With ``same_mutation``, a mistake must also change the same inputs in place (for an answer
    whose only fault is that it changed them). ``right(value)`` says whether a value passes the
    check: a mistake that happens to give a right answer on this input names nothing (an
    imprecise answer must not be told it scaled by sqrt(d_v) on an input where d_v = d_k). A mistake
    that calls a built-in of ``forbid`` is named by the guard, never by its result: the student's
    code could not have called it. ``same(student's value, mistake's value)`` says when two values are
    the same answer (default: tensors equal within ``rtol`` and ``atol``).
    """
    same = same or (lambda a, b: is_close(a, b, rtol, atol))

    def fits(mistake: Mistake) -> bool:
        theirs = run(mistake.fn, args, kwargs, forbid)
        if theirs.error is not None and theirs.error[0] == FORBIDDEN:
            return False
        if student.error is not None or theirs.error is not None:
            return student.error == theirs.error
        if same_mutation and tuple(theirs.mutated) != tuple(student.mutated):
            return False
        if not same_mutation and right is not None and _is_right(right, theirs.value):
            return False
        return same(student.value, theirs.value)

    found: list[Mistake] = []
    for mistake in mistakes:
        if not any(_same_mistake(m, mistake) for m in found) and fits(mistake):
            found.append(mistake)
    # No single mistake fits: two at once, when the catalogue declares them as variations of one reference.
    if not found and first_pair_search():
        found = next(([pair] for pair in pairs(mistakes) if fits(pair)), [])
    return found


def through(mistakes: Iterable[Mistake], wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[Mistake]:
    """``mistakes`` as a check runs them: each through ``wrap`` (a scenario of calls, a result flattened), as the
    student's answer is run. Pairs of them are still tried: made as variations first, then wrapped."""
    marked = wrapping(wrap)
    return [replace(m, fn=marked(m.fn)) for m in mistakes]


def by_id(mistakes: Iterable[Mistake], ident: str) -> Mistake:
    """The mistake of ``mistakes`` whose id is ``ident`` (a catalogue's own checks name mistakes by id)."""
    for mistake in mistakes:
        if mistake.id == ident:
            return mistake
    raise KeyError(f"no mistake {ident!r} in the catalogue")


def _same_mistake(a: Mistake, b: Mistake) -> bool:
    """Two implementations of one mistake (one id; without ids, one name)."""
    return a.id == b.id if a.id and b.id else a.name == b.name


def _is_right(right: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(right(value))
    except Exception:  # noqa: BLE001 - a value the comparison cannot even read is not right
        return False


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
    found = matching(student, mistakes, args, kwargs, rtol=rtol, atol=atol)
    return found[0] if found else None


def name_mistakes(mistakes: Sequence[Mistake]) -> str:
    """The paragraph naming the mistakes that fit: one message, or every one when several give the same result."""
    if len(mistakes) == 1:
        return mistakes[0].message()
    if not mistakes:
        return ""
    return ("More than one known mistake gives exactly this result on this input:\n"
            + "\n".join(f"- {m.message()}" for m in mistakes))


def catalogue(notebook: str, exercise: str) -> tuple[Mistake, ...]:
    """The catalogued mistakes of ``exercise`` in notebook module ``notebook``, when this installation has them.

    The grader has the instructor-only ``hidden`` package; the student's bundle does not, and
    there the answer is ``()``. The catalogue is the module's dict from exercise names to lists
    of :class:`Mistake`.
    """
    try:
        module = importlib.import_module(f"..hidden.{notebook}", __package__)
    except ImportError:
        return ()
    for value in vars(module).values():
        if isinstance(value, dict) and exercise in value and isinstance(value[exercise], list | tuple) \
                and all(isinstance(m, Mistake) for m in value[exercise]):
            return tuple(value[exercise])
    return ()
