"""Visible checks for notebook 03, causal and padding masks."""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.utils.rnn import pad_sequence

from ..errors import fail
from ..guard import ATTENTION_BUILTINS
from ..inputs import generator, math_sdpa, randn
from ..student import call_student, expect_error
from ..verify import Case, verify

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "masking"

INF = float("inf")


# --- referees built from PyTorch --------------------------------------------------------


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


# --- checks ------------------------------------------------------------------------------


def check_to_additive_mask(to_additive_mask) -> None:
    """0 where the boolean mask is True, -inf where it is False, in the requested dtype."""
    mask = torch.tensor([[True, False, True], [False, False, True]])
    expected = torch.tensor([[0.0, -INF, 0.0], [-INF, -INF, 0.0]])
    cases = [
        Case((mask, torch.float32), label="float32"),
        Case((mask, torch.float64), label="float64"),
        Case((mask, torch.float16), label="float16: -inf, not a large negative number"),
        Case((mask.to("meta"), torch.float32), label="a mask on the meta device: the result is on the mask's device"),
    ]
    verify(
        to_additive_mask,
        cases,
        lambda mask, dtype: expected.to(device=mask.device, dtype=dtype),
        exercise="to_additive_mask",
        notebook=NOTEBOOK,
        arg_names=("mask", "dtype"),
        outputs=None,
        rtol=0.0,
        atol=0.0,
    )
    print("to_additive_mask passes the visible checks.")


def check_causal_mask(causal_mask) -> None:
    """Against SDPA's is_causal=True (top-left) and causal_lower_right (bottom-right)."""
    cases = [
        Case((4,), label="n = m = 4, m left out"),
        Case((3, 5), {"align": "top_left"}, label="n < m, top-left like is_causal=True"),
        Case((3, 5), {"align": "bottom_right"}, label="n < m, bottom-right like causal_lower_right"),
        Case((5, 3), {"align": "bottom_right"}, label="n > m, bottom-right: the first rows see no key"),
        Case((2, 3), {"device": "meta"}, label="device='meta': the mask is made on that device"),
    ]
    verify(causal_mask, cases, causal_reference, exercise="causal_mask", notebook=NOTEBOOK, arg_names=("n", "m"),
           outputs=None, rtol=0.0, atol=0.0)
    expect_error(causal_mask, 3, 4, align="centre", error=ValueError, what="causal_mask(3, 4, align='centre')",
                 why="align must be 'top_left' or 'bottom_right'")
    print("causal_mask passes the visible checks.")


def check_padding_mask(padding_mask) -> None:
    """Against pad_sequence on sequences of True of the given lengths."""
    cases = [
        Case((torch.tensor([3, 1, 4]), 4), label="the longest sequence fills max_len"),
        Case((torch.tensor([2, 0]), 5), label="an empty sequence"),
    ]
    verify(padding_mask, cases, padding_reference, exercise="padding_mask", notebook=NOTEBOOK,
           arg_names=("lengths", "max_len"), outputs=None, rtol=0.0, atol=0.0)
    expect_error(padding_mask, torch.tensor([2, 6]), 5, error=ValueError, what="padding_mask(tensor([2, 6]), 5)",
                 why="a length of 6 does not fit in max_len = 5")
    print("padding_mask passes the visible checks.")


def check_masked_attention(masked_attention) -> None:
    """Against SDPA with attn_mask (math backend, float64), bool and float masks, rows with no key."""
    gen = generator(300)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    bias = torch.tensor([[0.0, -1.0, -INF], [-0.5, 0.0, -INF]], dtype=torch.float64)
    # batch of 2, keys of lengths 3 and 5; causal with left padding leaves a row with no key.
    left_padded = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    no_key = left_padded[:, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    cases = [
        Case((randn(2, 4, 8, gen=gen), randn(2, 4, 8, gen=gen), randn(2, 4, 3, gen=gen)), {"mask": causal},
             label="a boolean causal mask (4, 4)"),
        Case((randn(2, 3, gen=gen), randn(3, 3, gen=gen), randn(3, 2, gen=gen)), {"mask": bias},
             label="a float mask with finite biases and -inf"),
        Case((randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen)), {"mask": no_key},
             label="causal and left padding: rows 0 and 1 of batch 0 have no allowed key"),
        Case((randn(3, 4, gen=gen), randn(3, 4, gen=gen), randn(3, 4, gen=gen)), label="no mask"),
    ]
    verify(masked_attention, cases, masked_attention_reference, exercise="masked_attention", notebook=NOTEBOOK,
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS)
    result = call_student(masked_attention, *cases[2].args, **cases[2].kwargs, what="masked_attention(...)",
                          forbid=ATTENTION_BUILTINS)
    assert_exact_zeros(result, no_key, "masked_attention with a causal mask and left padding")
    expect_error(masked_attention, randn(2, 3, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen),
                 mask=torch.ones(3, 6, dtype=torch.bool), error=ValueError,
                 what="masked_attention(Q (2, 3, 4), K (2, 5, 4), V, mask (3, 6))",
                 why="a (3, 6) mask does not broadcast to the (2, 3, 5) scores")
    print("masked_attention passes the visible checks.")
