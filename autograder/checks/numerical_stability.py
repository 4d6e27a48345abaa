"""Visible checks for notebook 04, a softmax that never overflows.

PyTorch is the referee: ``torch.softmax``, ``torch.logsumexp`` and ``F.log_softmax``,
computed in float64 and rounded to the input's dtype. Inside the student's functions
those built-ins are forbidden. A row whose entries are all -inf has no softmax; this
course defines it as a row of zeros (log-softmax: a row of -inf, logsumexp: -inf).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..diagnosis import Mistake, MistakeFound, catalogue
from ..errors import CheckFailed, fail
from ..guard import SOFTMAX_BUILTINS
from ..inputs import generator, randn
from ..student import expect_error, probe
from ..verify import Case, verify_each
from ..watches import Reduction, reductions_of
from ..watches import ReductionRecorder as ReductionRecorder  # imported from here by the tests

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "numerical_stability"

INF = math.inf

# --- the referee --------------------------------------------------------------------------


def _empty_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """True where the whole row along ``dim`` is -inf (kept as a size-1 dim)."""
    return (x == -INF).all(dim=dim, keepdim=True)


def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax`` in float64, rows that are entirely -inf set to zeros, in ``x``'s dtype."""
    x64 = x.detach().double()
    p = torch.softmax(x64, dim=dim)
    return torch.where(_empty_rows(x64, dim), 0.0, p).to(x.dtype)


def logsumexp_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.logsumexp`` in float64 (-inf for rows that are entirely -inf), in ``x``'s dtype."""
    return torch.logsumexp(x.detach().double(), dim=dim).to(x.dtype)


def log_softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``F.log_softmax`` in float64, rows that are entirely -inf set to -inf, in ``x``'s dtype."""
    x64 = x.detach().double()
    p = torch.nn.functional.log_softmax(x64, dim=dim)
    return torch.where(_empty_rows(x64, dim), -INF, p).to(x.dtype)


def online_reference(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """The softmax over the last dimension (``block_size`` changes nothing in the result)."""
    return softmax_reference(x, -1)


# --- tolerances per dtype -------------------------------------------------------------------

#: (rtol, atol) for probabilities: a few units in the last place of each dtype.
SOFTMAX_TOLERANCE = {
    torch.float64: (1e-10, 1e-14),
    torch.float32: (1e-5, 1e-8),
    torch.float16: (1e-2, 1e-4),
    torch.bfloat16: (5e-2, 1e-3),
}


def softmax_tolerance(x: torch.Tensor) -> tuple[float, float]:
    """The (rtol, atol) a softmax of ``x`` is checked with."""
    return SOFTMAX_TOLERANCE[x.dtype]


def log_tolerance(x: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(rtol, atol) for a log-sum-exp or a log-softmax of ``x``.

    A log-sum-exp of entries near 1e4 is near 1e4 too, and a dtype holds it only to a
    relative precision ``eps``: the error allowed is a few ``eps`` times the largest
    finite magnitude among the inputs and the expected outputs.
    """
    finite = [t.detach().double()[torch.isfinite(t.detach().double())].abs() for t in (x, expected)]
    scale = max([1.0] + [float(t.max()) for t in finite if t.numel()])
    return 0.0, 8 * torch.finfo(x.dtype).eps * scale


def softmax_tolerance_of(x: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """The tolerance function :func:`~autograder.verify.verify_each` takes for probabilities."""
    return softmax_tolerance(x)


# --- inputs -------------------------------------------------------------------------------


def with_minus_inf(x: torch.Tensor, gen: torch.Generator, fraction: float = 0.3) -> torch.Tensor:
    """``x`` with about ``fraction`` of its entries set to -inf (every row keeps a finite entry)."""
    drop = torch.rand(x.shape, generator=gen, dtype=torch.float64) < fraction
    drop[..., 0] = False
    return x.masked_fill(drop.to(x.device), -INF)


# --- gradients and inputs left alone ------------------------------------------------------------


def unchanged_by(fn: Callable[..., Any], x: torch.Tensor, kwargs: dict) -> bool:
    """A probe: True when ``fn(x, **kwargs)`` leaves ``x`` as it was (errors of ``fn`` are reported elsewhere)."""
    before = x.clone()
    try:
        fn(x, **kwargs)
    except Exception:  # noqa: BLE001 - errors and forbidden calls are reported by the other checks
        pass
    return bool(torch.equal(x, before))


def leaves_input_untouched(fn: Callable[..., Any], x: torch.Tensor, exercise: str, **kwargs: Any) -> bool:
    """True when ``fn(x)`` leaves ``x`` as it was (errors and forbidden calls are reported elsewhere)."""
    try:
        return bool(probe(unchanged_by, fn, x, kwargs, what=exercise, forbid=SOFTMAX_BUILTINS))
    except CheckFailed:
        return True


def input_changed_message(exercise: str) -> str:
    """What a student reads when their function changed its input tensor."""
    return (
        f"{exercise} changed the tensor x it was given (an in-place operation such as x -= m, x.sub_(m) "
        "or x[...] = ... on the input). The caller's scores must stay as they were: write the shifted "
        "values to a new tensor (x - m)."
    )


def gradcheck_failure(fn: Callable[..., Any], x: torch.Tensor, kwargs: dict) -> str | None:
    """A probe: None when ``torch.autograd.gradcheck`` accepts ``fn`` at ``x`` (float64), else its first line."""
    x = x.detach().double().requires_grad_(True)
    try:
        torch.autograd.gradcheck(lambda t: fn(t, **kwargs), (x,), eps=1e-6, atol=1e-6, rtol=1e-4)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - what gradcheck or the function raised is the finding
        text = str(error).strip()
        return text.splitlines()[0] if text else type(error).__name__
    return None


def gradcheck_problem(fn: Callable[..., Any], x: torch.Tensor, exercise: str, **kwargs: Any) -> str | None:
    """None when ``torch.autograd.gradcheck`` accepts ``fn`` at ``x`` (float64), else what went wrong."""
    first = probe(gradcheck_failure, fn, x, kwargs, what=exercise, forbid=SOFTMAX_BUILTINS)
    if first is None:
        return None
    return (
        f"torch.autograd.gradcheck rejects the gradient of {exercise} on a float64 input of shape "
        f"{tuple(x.shape)} ({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {first}\n"
        "The gradient must flow from x to the result: no .item(), .numpy(), .detach() or torch.no_grad() on "
        "that path (detaching only the shift is fine: the result does not depend on it), and no in-place "
        "change of a tensor autograd still needs."
    )


# --- what online_softmax reduces over -------------------------------------------------------------


def record_reductions(online_softmax: Callable[..., Any], x: torch.Tensor, block_size: int) -> list[Reduction]:
    """Run ``online_softmax(x, block_size)`` under the guard and return the reductions it made."""
    found = probe(reductions_of, online_softmax, x, block_size,
                  what=f"online_softmax(x of shape {tuple(x.shape)}, {block_size})", forbid=SOFTMAX_BUILTINS)
    return [Reduction(str(kind), str(name), size if type(size) is int else None) for kind, name, size in found]


def streaming_problem(reductions: Sequence[Reduction], length: int, block_size: int) -> tuple[str, str] | None:
    """None when the reductions stream over blocks; else (what is wrong, which rule is broken).

    The rule: every max or sum covers at most ``block_size`` entries of a row, and the
    running max and running sum are updated together, block after block.
    """
    sized = [r for r in reductions if r.size is not None]
    if sized:
        largest = max(sized, key=lambda r: r.size)
        if largest.size > block_size:
            what = "the whole row" if largest.size >= length else "more than one block"
            return (
                f"online_softmax reduced {largest.size} entries at once ({largest.name}), {what}, but with "
                f"block_size={block_size} and rows of {length} entries each max or sum may cover at most "
                f"{block_size} entries of one row (reduce over the last dimension of one block).",
                "whole row" if largest.size >= length else "block",
            )
    maxima = [i for i, r in enumerate(reductions) if r.kind == "max"]
    sums = [i for i, r in enumerate(reductions) if r.kind == "sum"]
    if len(maxima) >= 2 and sums and min(sums) > max(maxima):
        return (
            f"online_softmax took the max of every block ({len(maxima)} of them) before summing any block: "
            "that is two passes over the row, one for the max and one for the sum. The online softmax reads "
            "each block once and updates the running max and the rescaled running sum together.",
            "two passes",
        )
    return None


#: The id of the catalogued mistake each broken streaming rule is (when the grader has the catalogue).
RULE_MISTAKES = {"whole row": "numerical_stability/online_softmax/the-whole-row-reduced-at-once",
                 "two passes": "numerical_stability/online_softmax/two-passes-over-the-row"}


def rule_mistakes(rule: str, notebook: str) -> list[Mistake]:
    """The catalogued mistake that breaks ``rule`` (none without the catalogue)."""
    return [m for m in catalogue(notebook, "online_softmax") if m.id == RULE_MISTAKES.get(rule)]


# --- the checks -----------------------------------------------------------------------------------


def _softmax_cases() -> list[Case]:
    gen = generator(40)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    return [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((with_minus_inf(randn(3, 4, gen=gen), gen),), label="some entries are -inf"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect zeros"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="softmax over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
        Case(((randn(2, 6, gen=gen) * 4).half(),), label="float16"),
    ]


def check_stable_softmax(stable_softmax) -> None:
    """Against torch.softmax on large, -inf and batched inputs, dims, float32 and float16; gradcheck."""
    verify_each(stable_softmax, _softmax_cases(), softmax_reference, softmax_tolerance_of,
                forbid=SOFTMAX_BUILTINS, exercise="stable_softmax", notebook=NOTEBOOK, arg_names=("x",))
    gen = generator(41)
    if not leaves_input_untouched(stable_softmax, randn(3, 4, gen=gen), "stable_softmax"):
        fail(input_changed_message("stable_softmax"))
    problem = gradcheck_problem(stable_softmax, randn(3, 4, gen=gen), "stable_softmax", dim=-1)
    if problem:
        fail(problem)
    expect_error(stable_softmax, randn(3, 4, gen=gen), dim=2, error=ValueError,
                 what="stable_softmax(x of shape (3, 4), dim=2)", why="x has no dimension 2")
    print("stable_softmax passes the visible checks.")


def check_logsumexp(logsumexp) -> None:
    """Against torch.logsumexp on large, -inf and batched inputs, dims and float32."""
    gen = generator(42)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    cases = [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect -inf"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
    ]
    verify_each(logsumexp, cases, logsumexp_reference, log_tolerance, forbid=SOFTMAX_BUILTINS, exercise="logsumexp",
                notebook=NOTEBOOK, arg_names=("x",))
    expect_error(logsumexp, randn(3, 4, gen=gen), dim=-3, error=ValueError,
                 what="logsumexp(x of shape (3, 4), dim=-3)", why="x has no dimension -3")
    print("logsumexp passes the visible checks.")


def check_log_softmax(log_softmax) -> None:
    """Against F.log_softmax on large, far-apart, -inf and batched inputs, dims and float32; gradcheck."""
    gen = generator(43)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    cases = [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((torch.tensor([[0.0, -1000.0, 3.0]], dtype=torch.float64),),
             label="an entry 1000 below the max: its softmax underflows to 0, its log-softmax is finite"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect -inf"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
    ]
    verify_each(log_softmax, cases, log_softmax_reference, log_tolerance, forbid=SOFTMAX_BUILTINS, exercise="log_softmax",
                notebook=NOTEBOOK, arg_names=("x",))
    problem = gradcheck_problem(log_softmax, randn(3, 4, gen=gen), "log_softmax", dim=-1)
    if problem:
        fail(problem)
    print("log_softmax passes the visible checks.")


def check_online_softmax(online_softmax) -> None:
    """Against torch.softmax for several block sizes; every max and sum covers at most one block."""
    gen = generator(44)
    x = randn(2, 10, gen=gen) * 3
    cases = [Case((x, b), label=f"rows of 10, block_size {b}") for b in (1, 3, 5, 10, 16)]
    masked = randn(2, 7, gen=gen)
    masked[0, :4] = -INF
    masked[1] = -INF
    cases += [
        Case((masked, 2), label="the first two blocks of row 0 are entirely -inf, row 1 is entirely -inf"),
        Case(((randn(2, 3, 9, gen=gen) * 30).float(), 4), label="float32 with two leading batch dimensions"),
        Case((torch.cat([torch.zeros(1), torch.full((300,), -8.0)]).half()[None], 1),
             label="float16: one entry 0, then 300 entries -8 (a float16 running sum would stay at 1)"),
    ]
    verify_each(online_softmax, cases, online_reference, softmax_tolerance_of, forbid=SOFTMAX_BUILTINS, exercise="online_softmax",
                notebook=NOTEBOOK, arg_names=("x", "block_size"))
    problem = streaming_problem(record_reductions(online_softmax, x, 3), x.shape[-1], 3)
    if problem:
        raise MistakeFound(problem[0], rule_mistakes(problem[1], NOTEBOOK))
    expect_error(online_softmax, x, 0, error=ValueError, what="online_softmax(x, block_size=0)",
                 why="a block must hold at least one entry")
    print("online_softmax passes the visible checks.")

