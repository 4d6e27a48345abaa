"""Visible checks for notebook 03, causal and padding masks."""

from __future__ import annotations

import torch

from ..grader.diagnosis import MistakeFound, catalogue
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error, probe
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.masking import (
    INF,
    assert_exact_zeros,
    causal_reference,
    default_device_problem,
    masked_attention_reference,
    padding_mask_off_the_default_device,
    padding_reference,
    same_off_the_default_device,
)
from ..references.masking import lower_right_pattern as lower_right_pattern  # the tests import them from here
from ..references.masking import sdpa_causal_pattern as sdpa_causal_pattern

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "masking"


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
    """Against pad_sequence on sequences of True of the given lengths; on the device of lengths whatever the
    default device."""
    cases = [
        Case((torch.tensor([3, 1, 4]), 4), label="the longest sequence fills max_len"),
        Case((torch.tensor([2, 0]), 5), label="an empty sequence"),
    ]
    verify(padding_mask, cases, padding_reference, exercise="padding_mask", notebook=NOTEBOOK,
           arg_names=("lengths", "max_len"), outputs=None, rtol=0.0, atol=0.0)
    expect_error(padding_mask, torch.tensor([2, 6]), 5, error=ValueError, what="padding_mask(tensor([2, 6]), 5)",
                 why="a length of 6 does not fit in max_len = 5")
    record = probe(padding_mask_off_the_default_device, padding_mask, torch.tensor([3, 1, 4]), 5,
                   what="padding_mask(tensor([3, 1, 4]), 5) with the default device set to meta")
    problem = default_device_problem(record, [3, 1, 4], 5)
    if problem:  # named where the catalogue is installed (grading), as verify names mistakes
        raise MistakeFound(problem, same_off_the_default_device(catalogue(NOTEBOOK, "padding_mask"), record, [3, 1, 4], 5))
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
