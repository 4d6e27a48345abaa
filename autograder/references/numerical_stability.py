"""What is right in notebook 04, a softmax that never overflows.

PyTorch is the referee: ``torch.softmax``, ``torch.logsumexp`` and ``F.log_softmax``,
computed in float64 and rounded to the input's dtype. A row whose entries are all -inf has
no softmax; this course defines it as a row of zeros (log-softmax: a row of -inf, logsumexp:
-inf). Also here: the tolerance per dtype, what the exercises must leave alone (their input,
autograd), and how an online softmax must stream over blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..grader.student import probe
from ..kernel.guard import SOFTMAX_BUILTINS
from ..kernel.watches import Reduction, reductions_of
from ..kernel.watches import ReductionRecorder as ReductionRecorder  # imported from here by the tests
from ..shared.errors import CheckFailed

INF = math.inf


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
    """The tolerance function :func:`~autograder.grader.verify.verify_each` takes for probabilities.

    A softmax written as ``exp(x - logsumexp(x))`` is stable, but ``x - lse`` rounds to
    ``eps * |x|``, which lands in every probability as a relative error of that size: 4e-4 in
    float32 near 1e4, where ``exp(x - max) / sum`` is exact to a few eps. That error is allowed
    up to one percent; beyond (float16 near 1000, where lse rounds to a multiple of 0.5), the
    rows no longer sum to one.
    """
    rtol, atol = softmax_tolerance(x)
    finite = x.detach().double()[torch.isfinite(x.detach().double())].abs()
    rounding = 2 * torch.finfo(x.dtype).eps * (float(finite.max()) if finite.numel() else 0.0)
    return (max(rtol, rounding) if rounding <= 1e-2 else rtol), atol


def with_minus_inf(x: torch.Tensor, gen: torch.Generator, fraction: float = 0.3) -> torch.Tensor:
    """``x`` with about ``fraction`` of its entries set to -inf (every row keeps a finite entry)."""
    drop = torch.rand(x.shape, generator=gen, dtype=torch.float64) < fraction
    drop[..., 0] = False
    return x.masked_fill(drop.to(x.device), -INF)


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
