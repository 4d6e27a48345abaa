"""Compare a student's function with a reference on many inputs, say how it differs, and name the mistake.

:func:`verify` compares tensors (or tuples of them) with a reference's, :func:`verify_each` does so
with a tolerance per input, :func:`verify_number` compares plain numbers with expected ones, and
:func:`naming_mistakes` names the mistake behind a failing check of a property.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..kernel.call import Outcome
from ..kernel.guard import Forbidden
from ..shared.errors import CheckFailed, fail
from . import cases as cases_of_check
from .compare import Mismatch, assert_matches, describe, is_close
from .diagnoses import explain_number
from .diagnosis import Mistake, MistakeFound, catalogue, matching, run
from .student import attempt, describe_error


def explain_mutation(positions: Sequence[int | str], arg_names: Sequence[str], subject: str = "Your function") -> str:
    """The sentence for a function that changed some of its tensor arguments in place."""
    names = [arg_names[p] if isinstance(p, int) and p < len(arg_names) else
             (f"argument {p}" if isinstance(p, int) else str(p)) for p in positions]
    return (
        f"{subject} changed its input(s) {', '.join(names)} in place (an operation such as x -= m, x /= s, "
        "x.add_(...), x.masked_fill_(...) or x[...] = ... on an argument). The caller's tensors must stay as they "
        "were: compute into a new tensor (x - m, x.masked_fill(...)), or work on x.clone()."
    )


@dataclass
class Case:
    """One input to an exercise; ``label`` says what is special about it."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    weight: float = 1.0  # its share of the test cell's points, among the check's cases (autograder.grader.cases)

    def name(self, names: Sequence[str]) -> str:
        """The case's name in a list of cases: its label, or the input in words."""
        return self.label or self.describe(names)

    def describe(self, names: Sequence[str]) -> str:
        """The input in words: each argument's name with its shape and dtype or value."""
        parts = []
        for name, value in zip(names, self.args):
            parts.append(f"{name} = {_short(value)}")
        parts += [f"{k} = {_short(v)}" for k, v in self.kwargs.items()]
        text = ", ".join(parts)
        return f"{text} ({self.label})" if self.label else text


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return f"<shape {tuple(value.shape)}, {value.dtype}, on the device '{value.device.type}'>"
        if value.numel() <= 6:
            return f"tensor({value.tolist()}, dtype={value.dtype})"
        return f"<shape {tuple(value.shape)}, {value.dtype}>"
    return repr(value)


def _compare(actual: Any, expected: Any, outputs: Sequence[str] | None, exercise: str, rtol: float, atol: float) -> None:
    if outputs is None:
        actual, expected, outputs = (actual,), (expected,), ("result",)
    elif not isinstance(actual, tuple) or len(actual) != len(outputs):
        fail(f"{exercise} should return a tuple ({', '.join(outputs)}), but it returned {describe(actual)}.")
    for name, got, want in zip(outputs, actual, expected):
        what = f"The {name} of {exercise}" if len(outputs) > 1 else f"The result of {exercise}"
        if not isinstance(want, torch.Tensor):
            if got != want:
                notes = (explain_number(got, want) if isinstance(got, float) and isinstance(want, float)
                         and not isinstance(got, bool) else [])
                raise Mismatch(f"{what} should be {want!r}, but it is {got!r}.", notes)
            continue
        assert_matches(got, want, what, rtol=rtol, atol=atol)


def verify(
    fn: Callable[..., Any],
    cases: Sequence[Case],
    reference: Callable[..., Any],
    *,
    exercise: str,
    arg_names: Sequence[str],
    outputs: Sequence[str] | None = ("output", "weights"),
    forbid: Sequence[Forbidden] = (),
    mistakes: Sequence[Mistake] | None = None,
    notebook: str | None = None,
    rtol: float = 1e-7,
    atol: float = 1e-9,
) -> None:
    """Fail on the first case where ``fn`` differs from ``reference`` or changes its inputs in place.

    The message names the input, says what differs (type, device, shape, dtype, the largest
    error and where), how it differs (:mod:`autograder.grader.diagnoses`) and, when the answer
    matches mistakes of the catalogue, names them. ``mistakes`` left out: the catalogue of
    ``exercise`` in the notebook module ``notebook``, when this installation has it (the
    grader does, the student's bundle does not).
    """
    if mistakes is None:
        mistakes = catalogue(notebook, exercise) if notebook else ()
    outcomes: dict[int, tuple[Outcome, BaseException | None]] = {}

    def outcome_of(case: Case) -> tuple[Outcome, BaseException | None]:
        if id(case) not in outcomes:  # the student's function runs once per input, however often it is diagnosed
            outcomes[id(case)] = attempt(fn, case.args, case.kwargs, exercise=exercise, forbid=forbid)
        return outcomes[id(case)]

    for case in cases:
        with cases_of_check.case(case.name(arg_names), case.weight):
            _verify_case(case, cases, outcome_of, reference, exercise, arg_names, outputs, forbid, mistakes, rtol, atol)


def _verify_case(case: Case, cases: Sequence[Case], outcome_of: Callable[[Case], tuple[Outcome, BaseException | None]],
                 reference: Callable[..., Any], exercise: str, arg_names: Sequence[str], outputs: Sequence[str] | None,
                 forbid: Sequence[Forbidden], mistakes: Sequence[Mistake], rtol: float, atol: float) -> None:
    """:func:`verify` on one of its ``cases``: fail, naming the mistake, when ``fn`` is wrong there."""
    outcome, error = outcome_of(case)
    expected = reference(*case.args, **case.kwargs)

    def right(value: Any, expected: Any = expected) -> bool:
        return _passes(value, expected, outputs, exercise, rtol, atol)

    def others() -> Iterator[Other]:
        for other in cases:
            if other is not case:
                expected_there = reference(*other.args, **other.kwargs)
                yield Other(other, outcome_of(other)[0],
                            lambda v, e=expected_there: _passes(v, e, outputs, exercise, rtol, atol))

    problem, notes, same_mutation = None, [], False
    if error is not None:
        problem = describe_error(f"{exercise}(...)", error)
    else:
        try:
            _compare(outcome.value, expected, outputs, exercise, rtol, atol)
        except CheckFailed as failure:
            problem = str(failure)
            notes = [explain_mutation(outcome.mutated, arg_names)] if outcome.mutated else []
    if problem is None and outcome.mutated:
        problem = explain_mutation(outcome.mutated, arg_names, f"{exercise} returned the right result, but it")
        same_mutation = True
    if problem is not None:
        found = matching(outcome, mistakes, case.args, case.kwargs, same_mutation=same_mutation, right=right,
                         forbid=forbid)
        message = "\n".join([f"With the input {case.describe(arg_names)}:", problem, *notes])
        raise MistakeFound(message, narrowed(found, others(), forbid) if found else ()) from None


@dataclass
class Other:
    """The student's outcome on another input of the same check, and what passes there."""

    case: Case
    outcome: Outcome
    right: Callable[[Any], bool]


def _passes(value: Any, expected: Any, outputs: Sequence[str] | None, exercise: str, rtol: float, atol: float) -> bool:
    try:
        _compare(value, expected, outputs, exercise, rtol, atol)
    except CheckFailed:
        return False
    return True


def _wrong_there(mistake: Mistake, other: Other, forbid: Sequence[Forbidden]) -> bool:
    """Whether ``mistake`` gives a failing answer (or an error) on ``other``'s input."""
    theirs = run(mistake.fn, other.case.args, other.case.kwargs, forbid)
    return theirs.error is not None or not other.right(theirs.value)


def narrowed(found: list[Mistake], others: Iterable[Other], forbid: Sequence[Forbidden] = ()) -> list[Mistake]:
    """Of the mistakes that fit one input, those the student's answers to the other inputs do not rule out.

    A mistake is ruled out by an input the student gets right and the mistake gets wrong: an
    answer that matched "argmin instead of argmax" on one input by chance, and is right where
    argmin is not, is not told it used argmin. Of several mistakes left (4 bytes assumed and two
    matrices counted give the same number on float16), those that also fit the student's wrong
    answers to the other inputs; when none fits them all, every one left is kept: each may be
    the student's (with another mistake besides).
    """
    try:
        others = list(others)
        remaining = [m for m in found if not any(
            o.outcome.error is None and not o.outcome.mutated and o.right(o.outcome.value) and _wrong_there(m, o, forbid)
            for o in others)]
        kept = remaining
        for other in others:
            if len(remaining) < 2:
                break
            if other.outcome.error is None and other.right(other.outcome.value):
                continue
            still = matching(other.outcome, remaining, other.case.args, other.case.kwargs)
            if not still:
                return kept
            remaining = still
    except CheckFailed:  # a forbidden call or an unwritten exercise on another input: keep what fits this one
        return found
    return remaining


@contextlib.contextmanager
def naming_mistakes(
    fn: Callable[..., Any],
    case: Case,
    expected: Any,
    *,
    exercise: str,
    notebook: str,
    forbid: Sequence[Forbidden] = (),
    rtol: float = 1e-7,
    atol: float = 1e-9,
    confirm: Sequence[tuple[Case, Any]] = (),
) -> Iterator[None]:
    """Checks of properties inside: when one fails, name the catalogued mistakes that ``fn``'s result on ``case`` matches.

    A check of a property (a norm kept, a row that sums to one) says what is wrong in
    general; the student's result on ``case``, whose right answer is ``expected``, says which
    catalogued mistake it is, when the grader has the catalogue (the bundle does not, and
    nothing more runs there). A mistake named must also reproduce ``fn``'s result on each input of
    ``confirm`` (pairs of an input and its right answer): on one small table two mistakes can coincide.
    """
    try:
        yield
    except CheckFailed as failure:
        mistakes = catalogue(notebook, exercise)
        if not mistakes:
            raise
        found = list(mistakes)
        for other, right_there in [(case, expected), *confirm]:  # a named mistake reproduces every one of them
            try:
                theirs, _ = attempt(fn, other.args, other.kwargs, exercise=exercise, forbid=forbid)
            except CheckFailed:
                raise failure from None
            found = matching(theirs, found, other.args, other.kwargs,
                             right=lambda v, w=right_there: is_close(v, w, rtol, atol), forbid=forbid)
            if not found:
                raise
        raise MistakeFound(str(failure), found) from None


def verify_each(
    fn: Callable[..., Any],
    cases: Sequence[Case],
    reference: Callable[..., Any],
    tolerance: Callable[[Any, Any], tuple[float, float]],
    *,
    exercise: str,
    arg_names: Sequence[str],
    forbid: Sequence[Forbidden] = (),
    mistakes: Sequence[Mistake] | None = None,
    notebook: str | None = None,
) -> None:
    """:func:`verify` case by case (one result each), each case with the tolerance of its dtype and scale.

    ``tolerance(first argument, expected)`` gives the case's ``(rtol, atol)``. ``verify`` names
    only the mistakes that are wrong on a case, so an answer that is merely imprecise is never told
    it made a mistake whose output happens to be right there.
    """
    for case in cases:
        expected = reference(*case.args, **case.kwargs)
        rtol, atol = tolerance(case.args[0], expected)
        verify(fn, [case], reference, exercise=exercise, notebook=notebook, arg_names=arg_names, outputs=None,
               forbid=forbid, mistakes=mistakes, rtol=rtol, atol=atol)


def _same_number(actual: Any, expected: Any, integer: bool, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        return False
    if integer:
        return isinstance(actual, int) and actual == expected
    return math.isclose(actual, expected, rel_tol=rel_tol, abs_tol=abs_tol)


def _type_problem(value: Any, integer: bool, what: str) -> str | None:
    """A message when ``value`` is not a plain Python number of the right kind."""
    wanted = "an int" if integer else "a float"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        hint = " Convert it with .item() or float(...)." if isinstance(value, torch.Tensor) else ""
        return f"{what} should be {wanted} (a plain Python number), but it is {kind}.{hint}"
    if integer and not isinstance(value, int):
        return (f"{what} should be an int, but it is the float {value!r}. Sizes and counts are whole numbers: "
                "multiply ints, and use // rather than / if you divide.")
    return None


def verify_number(
    fn: Callable[..., Any],
    cases: Sequence[tuple[Case, Any]],
    *,
    exercise: str,
    arg_names: Sequence[str],
    integer: bool,
    mistakes: Sequence[Mistake] | None = None,
    notebook: str | None = None,
    rel_tol: float = 1e-9,
    abs_tol: float = 1e-9,
) -> None:
    """Fail on the first ``(case, expected)`` where ``fn`` does not return ``expected``.

    Integers must be equal and of type ``int``; floats equal within the tolerances. A float
    that is the expected one rounded is told so. When the wrong answer equals what catalogued
    mistakes return (``mistakes``, or the catalogue of ``notebook`` when the grader has it),
    the message names them, all of them when several give that number.
    """
    if mistakes is None:
        mistakes = catalogue(notebook, exercise) if notebook else ()

    def same(student: Any, theirs: Any) -> bool:
        same_kind = not integer or isinstance(student, int) == isinstance(theirs, int)
        return same_kind and isinstance(theirs, (int, float)) and _same_number(student, theirs, False, rel_tol, abs_tol)

    def fitting(outcome: Outcome, among: Sequence[Mistake], case: Case, expected: Any = None) -> list[Mistake]:
        right = None if expected is None else (lambda v: _same_number(v, expected, integer, rel_tol, abs_tol))
        return matching(outcome, among, case.args, case.kwargs, right=right, same=same)

    for case, expected in cases:
        with cases_of_check.case(case.name(arg_names), case.weight):
            _verify_number_case(case, expected, cases, fn, exercise, arg_names, integer, mistakes, fitting,
                                rel_tol, abs_tol)


def _verify_number_case(case: Case, expected: Any, cases: Sequence[tuple[Case, Any]], fn: Callable[..., Any],
                        exercise: str, arg_names: Sequence[str], integer: bool, mistakes: Sequence[Mistake],
                        fitting: Callable[..., list[Mistake]], rel_tol: float, abs_tol: float) -> None:
    """:func:`verify_number` on one of its ``cases``."""
    outcome, error = attempt(fn, case.args, case.kwargs, exercise=exercise)
    notes: list[str] = []
    try:
        if error is not None:
            fail(describe_error(f"{exercise}(...)", error))
        what = f"The result of {exercise}"
        problem = _type_problem(outcome.value, integer, what)
        if problem:
            fail(problem)
        if not _same_number(outcome.value, expected, integer, rel_tol, abs_tol):
            if not integer:
                notes = explain_number(float(outcome.value), float(expected))
            fail(f"{what} should be {expected!r}, but it is {outcome.value!r}.")
    except CheckFailed as failure:
        message = "\n".join([f"With the input {case.describe(arg_names)}:", str(failure), *notes])
        found = fitting(outcome, mistakes, case, expected)
        if len(found) > 1:  # the student's answers to the other inputs may tell them apart
            for other, _ in cases:
                if other is not case and len(found) > 1:
                    theirs, _ = attempt(fn, other.args, other.kwargs, exercise=exercise)
                    found = fitting(theirs, found, other) or found
        raise MistakeFound(message, found) from None
