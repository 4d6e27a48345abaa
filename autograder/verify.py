"""Compare a student's function with a reference on many inputs, and name the mistake."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .compare import assert_close, assert_dtype, assert_shape, assert_tensor, describe
from .diagnosis import Mistake, diagnose
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
                fail(f"{what} should be {want!r}, but it is {got!r}.")
            continue
        assert_tensor(got, what)
        assert_shape(got, tuple(want.shape), what)
        assert_dtype(got, want.dtype, what)
        assert_close(got, want, what, rtol=rtol, atol=atol)


def verify(
    fn: Callable[..., Any],
    cases: Sequence[Case],
    reference: Callable[..., Any],
    *,
    exercise: str,
    arg_names: Sequence[str],
    outputs: Sequence[str] | None = ("output", "weights"),
    forbid: Sequence[Forbidden] = (),
    mistakes: Sequence[Mistake] = (),
    rtol: float = 1e-7,
    atol: float = 1e-9,
) -> None:
    """Fail on the first case where ``fn`` differs from ``reference``.

    The message names the input, says what differs (type, shape, dtype, the largest
    error and where) and, when the answer matches a mistake of the catalogue, names it.
    """
    for case in cases:
        outcome, error = attempt(fn, case.args, case.kwargs, exercise=exercise, forbid=forbid)
        try:
            if error is not None:
                fail(describe_error(f"{exercise}(...)", error))
            _compare(outcome.value, reference(*case.args, **case.kwargs), outputs, exercise, rtol, atol)
        except CheckFailed as problem:
            message = f"With the input {case.describe(arg_names)}:\n{problem}"
            mistake = diagnose(outcome, mistakes, case.args, case.kwargs)
            if mistake is not None:
                message += "\n" + mistake.message()
            raise CheckFailed(message) from None
