"""Compare a student's function with a reference on many inputs, say how it differs, and name the mistake."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .compare import Mismatch, assert_matches, describe
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

        if error is not None:
            _fail_case(case, arg_names, describe_error(f"{exercise}(...)", error), outcome, mistakes, right)
        try:
            _compare(outcome.value, expected, outputs, exercise, rtol, atol)
        except CheckFailed as problem:
            notes = [explain_mutation(outcome.mutated, arg_names)] if outcome.mutated else []
            _fail_case(case, arg_names, str(problem), outcome, mistakes, right, notes)
        if outcome.mutated:
            problem = explain_mutation(outcome.mutated, arg_names, f"{exercise} returned the right result, but it")
            _fail_case(case, arg_names, problem, outcome, mistakes, right, same_mutation=True)


def _fail_case(case: Case, arg_names: Sequence[str], problem: str, outcome: Outcome, mistakes: Sequence[Mistake],
               right: Callable[[Any], bool], notes: Sequence[str] = (), *, same_mutation: bool = False) -> None:
    message = "\n".join([f"With the input {case.describe(arg_names)}:", problem, *notes])
    found = matching(outcome, mistakes, case.args, case.kwargs, same_mutation=same_mutation, right=right)
    if found:
        message += "\n" + name_mistakes(found)
    raise CheckFailed(message) from None
