"""Compare a student's function with a reference on many inputs, say how it differs, and name the mistake."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .compare import Mismatch, assert_matches, describe, is_close
from .diagnoses import explain_mutation, explain_number
from .diagnosis import Mistake, Outcome, catalogue, matching, name_mistakes
from .errors import CheckFailed, fail
from .guard import Forbidden
from .student import attempt, describe_error


@dataclass
class Case:
    """One input to an exercise; ``label`` says what is special about it."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""

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
    error and where), how it differs (:mod:`autograder.diagnoses`) and, when the answer
    matches mistakes of the catalogue, names them. ``mistakes`` left out: the catalogue of
    ``exercise`` in the notebook module ``notebook``, when this installation has it (the
    grader does, the student's bundle does not).
    """
    if mistakes is None:
        mistakes = catalogue(notebook, exercise) if notebook else ()
    for case in cases:
        outcome, error = attempt(fn, case.args, case.kwargs, exercise=exercise, forbid=forbid)
        expected = reference(*case.args, **case.kwargs)

        def right(value: Any, expected: Any = expected) -> bool:
            try:
                _compare(value, expected, outputs, exercise, rtol, atol)
            except CheckFailed:
                return False
            return True

        def others(case: Case = case) -> Iterator[tuple[Case, Outcome]]:
            for other in cases:
                if other is not case:
                    yield other, attempt(fn, other.args, other.kwargs, exercise=exercise, forbid=forbid)[0]

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
            raise CheckFailed(message + ("\n" + name_mistakes(narrowed(found, others())) if found else "")) from None


def narrowed(found: list[Mistake], others: Iterable[tuple[Case, Outcome]]) -> list[Mistake]:
    """Of several mistakes that fit one input, those that also fit the student's results on the other inputs.

    Two mistakes can give the same result on one input (4 bytes assumed and two matrices counted,
    on float16): the student's answers to the other inputs tell them apart. When no mistake fits
    them all, every one that fit the failing input is kept: each may be the student's.
    """
    if len(found) < 2:
        return found
    remaining = list(found)
    try:
        for other, outcome in others:
            still = matching(outcome, remaining, other.args, other.kwargs)
            if not still:
                return found
            remaining = still
            if len(remaining) == 1:
                break
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
) -> Iterator[None]:
    """Checks of properties inside: when one fails, name the catalogued mistakes that ``fn``'s result on ``case`` matches.

    A check of a property (a norm kept, a row that sums to one) says what is wrong in
    general; the student's result on ``case``, whose right answer is ``expected``, says which
    catalogued mistake it is, when the grader has the catalogue (the bundle does not, and
    nothing more runs there).
    """
    try:
        yield
    except CheckFailed as failure:
        mistakes = catalogue(notebook, exercise)
        if not mistakes:
            raise
        try:
            outcome, _ = attempt(fn, case.args, case.kwargs, exercise=exercise, forbid=forbid)
        except CheckFailed:
            raise failure from None
        found = matching(outcome, mistakes, case.args, case.kwargs, right=lambda v: is_close(v, expected, rtol, atol),
                         forbid=forbid)
        if not found:
            raise
        raise CheckFailed(f"{failure}\n{name_mistakes(found)}") from None
