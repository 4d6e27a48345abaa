"""What is right in notebook 03, masks: PyTorch's masked attention as the referee, and the masks it takes."""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.utils.rnn import pad_sequence

from ..errors import fail
from ..inputs import math_sdpa

INF = float("inf")


def sdpa_causal_pattern(n: int, m: int) -> torch.Tensor:
    """The keys ``F.scaled_dot_product_attention(..., is_causal=True)`` lets each query see.

    With all scores equal (zero queries and keys) and the identity as values, the output
    is the weight matrix itself: uniform over the allowed keys, zero elsewhere.
    """
    zeros_q = torch.zeros(n, 1, dtype=torch.float64)
    zeros_k = torch.zeros(m, 1, dtype=torch.float64)
    weights = math_sdpa(zeros_q, zeros_k, torch.eye(m, dtype=torch.float64), is_causal=True)
    return weights > 0


def lower_right_pattern(n: int, m: int) -> torch.Tensor:
    """``torch.nn.attention.bias.causal_lower_right(n, m)`` as a boolean (n, m) matrix."""
    with warnings.catch_warnings():
        # PyTorch warns that rows without keys may give NaN when n > m; the pattern is what we want.
        warnings.simplefilter("ignore")
        return causal_lower_right(n, m)._materialize().to(torch.bool)


def causal_reference(n, m=None, *, align="top_left", device=None):
    """The mask SDPA's ``is_causal=True`` (top-left) or ``causal_lower_right`` (bottom-right) uses, on ``device``."""
    m = n if m is None else m
    mask = sdpa_causal_pattern(n, m) if align == "top_left" else lower_right_pattern(n, m)
    return mask if device is None else mask.to(device)


def padding_reference(lengths, max_len):
    """Pad sequences of True of the given lengths with False up to ``max_len`` (``pad_sequence``)."""
    rows = [torch.ones(int(length), dtype=torch.bool) for length in lengths]
    rows.append(torch.zeros(max_len, dtype=torch.bool))  # forces the padded length to max_len
    return pad_sequence(rows, batch_first=True, padding_value=False)[:-1]


def allowed_keys(mask: torch.Tensor | None, scores_shape: torch.Size) -> torch.Tensor:
    """Which (query, key) pairs a bool or float mask allows, broadcast to ``scores_shape``."""
    if mask is None:
        return torch.ones(scores_shape, dtype=torch.bool)
    allowed = mask if mask.dtype == torch.bool else mask > -INF
    return allowed.expand(scores_shape)


def masked_attention_reference(Q, K, V, mask=None):
    """SDPA (math backend, float64) with ``attn_mask``; its weights are SDPA applied to the identity.

    Rows with no allowed key are set to exactly zero: the convention of this course.
    """
    q, k, v = Q.double(), K.double(), V.double()
    attn_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    m = k.shape[-2]
    eye = torch.eye(m, dtype=torch.float64).expand(*k.shape[:-2], m, m)
    output = math_sdpa(q, k, v, attn_mask=attn_mask)
    weights = math_sdpa(q, k, eye, attn_mask=attn_mask)
    no_key = ~allowed_keys(mask, weights.shape).any(dim=-1, keepdim=True)
    output = output.masked_fill(no_key, 0.0)
    weights = weights.masked_fill(no_key, 0.0)
    return output.to(Q.dtype), weights.to(Q.dtype)


def assert_exact_zeros(result, mask, what: str) -> None:
    """Rows with no allowed key must be exactly zero (weights and output), never NaN."""
    output, weights = result
    no_key = ~allowed_keys(mask, weights.shape).any(dim=-1)
    for name, value in (("weights", weights), ("output", output)):
        rows = value[no_key]
        if not bool((rows == 0).all()):
            bad = rows[rows != 0]
            fail(
                f"{what}: the {name} of the rows with no allowed key should be exactly 0, "
                f"but they contain {bad[0].item():.6g}"
                + (" (NaN: softmax of a row that is all -inf is 0/0)." if bool(bad.isnan().any()) else ".")
            )
