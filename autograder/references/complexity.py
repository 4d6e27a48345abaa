"""What is right in notebook 07, the cost of attention: ``F.scaled_dot_product_attention`` (math
backend, float64) as the referee of the attention exercises, the arguments of the counting
exercises and the tolerance of a fitted exponent."""

from __future__ import annotations

import torch

from ..errors import fail
from ..inputs import math_sdpa
from ..student import call_student

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
