"""Visible checks for notebook 07, the cost of attention and FlashAttention.

The counting exercises are checked against numbers worked out by hand from the formulas
of the notebook; the attention exercises against ``F.scaled_dot_product_attention``
(math backend, float64), which the student's functions may not call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..diagnoses import explain_number
from ..diagnosis import Mistake, Outcome, catalogue, name_mistakes, run
from ..errors import CheckFailed, fail
from ..guard import ATTENTION_BUILTINS
from ..inputs import generator, math_sdpa, randn
from ..student import attempt, call_student, describe_error, expect_error
from ..verify import Case, verify

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "complexity"

# --- numbers: a checker for exercises that return an int or a float ------------------------


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
    for case, expected in cases:
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
            found = _matching_mistakes(outcome, mistakes, case, expected, integer, rel_tol, abs_tol)
            if len(found) > 1:  # the student's answers to the other inputs may tell them apart
                for other, _ in cases:
                    if other is not case and len(found) > 1:
                        theirs, _ = attempt(fn, other.args, other.kwargs, exercise=exercise)
                        found = _matching_mistakes(theirs, found, other, None, integer, rel_tol, abs_tol) or found
            if found:
                message += "\n" + name_mistakes(found)
            raise CheckFailed(message) from None


def _matching_mistakes(student: Outcome, mistakes: Sequence[Mistake], case: Case, expected: Any, integer: bool,
                       rel_tol: float, abs_tol: float) -> list[Mistake]:
    """Every mistake (one per name) that returns the student's number, or raises the student's error, on ``case``.

    A mistake that returns the right number (``expected``; None: not known) on this case names nothing.
    """
    found: list[Mistake] = []
    for mistake in mistakes:
        if any(m.name == mistake.name for m in found):
            continue
        theirs = run(mistake.fn, case.args, case.kwargs)
        if student.error is not None or theirs.error is not None:
            if student.error == theirs.error:
                found.append(mistake)
            continue
        if expected is not None and _same_number(theirs.value, expected, integer, rel_tol, abs_tol):
            continue
        same_kind = not integer or isinstance(student.value, int) == isinstance(theirs.value, int)
        if same_kind and isinstance(theirs.value, (int, float)) and _same_number(
            student.value, theirs.value, False, rel_tol, abs_tol
        ):
            found.append(mistake)
    return found


# --- the counting exercises ---------------------------------------------------------------------

#: Tolerances of a fitted exponent: loose enough for a fit computed in float32.
FIT_RTOL, FIT_ATOL = 1e-5, 1e-6
FLOPS_ARGS = ("batch", "heads", "n", "m", "d_k", "d_v")
MEMORY_ARGS = ("batch", "heads", "n", "m", "dtype")


def check_attention_flops(attention_flops) -> None:
    """Two configurations whose FLOPs were counted by hand."""
    cases = [
        # one head, one query, one key, d_k = d_v = 1: one multiply-add in each product.
        (Case((1, 1, 1, 1, 1, 1), label="one query, one key, one dimension"), 4),
        # 2 * 2*3*5*7*11 + 2 * 2*3*5*7*13 = 4620 + 5460
        (Case((2, 3, 5, 7, 11, 13), label="every size different"), 10080),
    ]
    verify_number(attention_flops, cases, exercise="attention_flops", notebook=NOTEBOOK, arg_names=FLOPS_ARGS,
                  integer=True)
    print("attention_flops passes the visible checks.")


def check_attention_memory_bytes(attention_memory_bytes) -> None:
    """Three configurations whose bytes were counted by hand, in three dtypes."""
    cases = [
        (Case((1, 1, 2, 3, torch.float32), label="6 entries of 4 bytes"), 24),
        (Case((2, 4, 8, 16, torch.float16), label="1024 entries of 2 bytes"), 2048),
        (Case((3, 1, 5, 2, torch.float64), label="30 entries of 8 bytes"), 240),
    ]
    verify_number(attention_memory_bytes, cases, exercise="attention_memory_bytes", notebook=NOTEBOOK,
                  arg_names=MEMORY_ARGS, integer=True)
    print("attention_memory_bytes passes the visible checks.")


def check_fit_power_law(fit_power_law) -> None:
    """An exact power law with a constant that is not 1, and a noisy one whose fit was computed once."""
    ns = [16, 32, 64, 128, 256]
    exact = [5.0 * n**2 for n in ns]
    noisy = [1.0, 2.5, 9.0, 14.0, 70.0]  # least-squares slope of (log n, log cost): 1.4743992861060176
    cases = [
        (Case((ns, exact), label="cost = 5 n^2 exactly"), 2.0),
        (Case(([1, 2, 4, 8, 16], noisy), label="noisy data"), 1.4743992861060176),
    ]
    verify_number(fit_power_law, cases, exercise="fit_power_law", notebook=NOTEBOOK, arg_names=("ns", "costs"),
                  integer=False, rel_tol=FIT_RTOL, abs_tol=FIT_ATOL)
    expect_error(fit_power_law, [1, 2, 3], [1.0, 2.0], error=ValueError, what="fit_power_law([1, 2, 3], [1.0, 2.0])",
                 why="there are 3 sizes and 2 costs")
    print("fit_power_law passes the visible checks.")


# --- the attention exercises -----------------------------------------------------------------------


def sdpa_reference(Q, K, V, size, is_causal=False):
    """What chunked_attention and flash_attention must return: SDPA (math backend), top-left causal."""
    return math_sdpa(Q, K, V, is_causal=is_causal)


def _attention_cases() -> list[Case]:
    gen = generator(70)
    return [
        Case((randn(2, 10, 4, gen=gen), randn(2, 10, 4, gen=gen), randn(2, 10, 3, gen=gen), 4),
             label="10 queries, size 4: the last chunk or block has 2"),
        Case((randn(2, 7, 4, gen=gen), randn(2, 11, 4, gen=gen), randn(2, 11, 5, gen=gen), 3), {"is_causal": True},
             label="causal with n = 7 < m = 11"),
    ]


def _check_attention(fn, exercise: str, size_name: str, cases: list[Case]) -> None:
    verify(fn, cases, sdpa_reference, exercise=exercise, notebook=NOTEBOOK, arg_names=("Q", "K", "V", size_name),
           outputs=None, forbid=ATTENTION_BUILTINS, rtol=1e-9, atol=1e-11)
    gen = generator(71)
    expect_error(fn, randn(2, 3, 4, gen=gen), randn(2, 5, 3, gen=gen), randn(2, 5, 6, gen=gen), 2,
                 error=ValueError, what=f"{exercise}(Q (2, 3, 4), K (2, 5, 3), V (2, 5, 6), 2)",
                 why="Q and K have different d_k (4 and 3)")


def check_chunked_attention(chunked_attention) -> None:
    """Against SDPA: a last chunk that is shorter, and causal attention with n < m."""
    _check_attention(chunked_attention, "chunked_attention", "chunk_size", _attention_cases())
    print("chunked_attention passes the visible checks.")


def check_flash_attention(flash_attention) -> None:
    """Against SDPA: shorter last blocks, causal with n < m, and scores large enough to overflow exp."""
    gen = generator(72)
    large = Case((30 * randn(1, 9, 4, gen=gen), 30 * randn(1, 9, 4, gen=gen), randn(1, 9, 2, gen=gen), 4),
                 label="scores in the thousands: exp of a raw score overflows")
    _check_attention(flash_attention, "flash_attention", "block_size", _attention_cases() + [large])
    print("flash_attention passes the visible checks.")


# --- sliding window ---------------------------------------------------------------------------------


def assert_bool_mask(sliding_window_mask) -> None:
    """Fail unless the mask is a torch.bool tensor (True = may attend), before comparing values."""
    mask = call_student(sliding_window_mask, 4, 2, what="sliding_window_mask(4, 2)")
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        got = f"dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        fail(f"sliding_window_mask(4, 2) should return a torch.bool tensor (True = may attend, SDPA's "
             f"convention), but it returned {got}. A comparison such as (a >= 0) & (a < w) is already boolean.")


def check_sliding_window_mask(sliding_window_mask) -> None:
    """A 5 x 5 mask with a window of 2, written out."""
    assert_bool_mask(sliding_window_mask)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    verify(sliding_window_mask, [Case((5, 2), label="each query sees itself and the previous key")],
           lambda n, window: expected, exercise="sliding_window_mask", notebook=NOTEBOOK, arg_names=("n", "window"),
           outputs=None)
    expect_error(sliding_window_mask, 4, 0, error=ValueError, what="sliding_window_mask(4, 0)",
                 why="a window must hold at least one key")
    print("sliding_window_mask passes the visible checks.")
