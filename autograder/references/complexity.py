"""What is right in notebook 07, the cost of attention: ``F.scaled_dot_product_attention`` (math
backend, float64) as the referee of the attention exercises, the arguments of the counting
exercises, the tolerance of a fitted exponent, and inputs whose every score is very negative."""

from __future__ import annotations

import math

import torch

from ..grader.inputs import math_sdpa, randn
from ..grader.student import call_student
from ..shared.errors import fail

#: Tolerances of a fitted exponent: loose enough for a fit computed in float32.
FIT_RTOL, FIT_ATOL = 1e-5, 1e-6


FLOPS_ARGS = ("batch", "heads", "n", "m", "d_k", "d_v")


MEMORY_ARGS = ("batch", "heads", "n", "m", "dtype")


def sdpa_reference(Q, K, V, size, is_causal=False):
    """What chunked_attention and flash_attention must return: SDPA (math backend), top-left causal."""
    return math_sdpa(Q, K, V, is_causal=is_causal)


def assert_bool_mask(sliding_window_mask) -> None:
    """Fail unless the mask is a torch.bool tensor (True = may attend), before comparing values."""
    mask = call_student(sliding_window_mask, 4, 2, what="sliding_window_mask(4, 2)")
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        got = f"dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        fail(f"sliding_window_mask(4, 2) should return a torch.bool tensor (True = may attend, SDPA's "
             f"convention), but it returned {got}. A comparison such as (a >= 0) & (a < w) is already boolean.")


def very_negative_scores(gen: torch.Generator, batch: tuple, n: int, m: int, d_k: int, d_v: int,
                         magnitude: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V (float64) whose every scaled score is -magnitude plus an ordinary random score.

    The keys share a component ``a u`` along one unit vector u and the queries the opposite one,
    ``-a u``, with a^2 = magnitude sqrt(d_k); what is left of each is orthogonal to u. So
    q.k / sqrt(d_k) = -magnitude + q'.k' / sqrt(d_k). An online softmax whose running maximum
    starts at a finite value above the scores, 0 say, sees exp(s - 0) underflow to 0 in every
    entry of the row and returns 0/0. Beyond about 1e16 the random part is lost in rounding and
    every score of a row is the same number (uniform weights), whichever correct formula computes it.
    """
    u = randn(d_k, gen=gen)
    u = u / u.norm()

    def orthogonal(x: torch.Tensor) -> torch.Tensor:
        return x - (x @ u)[..., None] * u

    a = math.sqrt(magnitude * math.sqrt(d_k))
    Q = orthogonal(randn(*batch, n, d_k, gen=gen)) - a * u
    K = orthogonal(randn(*batch, m, d_k, gen=gen)) + a * u
    return Q, K, randn(*batch, m, d_v, gen=gen)
