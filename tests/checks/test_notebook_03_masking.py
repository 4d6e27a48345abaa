"""Notebook 03: the reference passes every check, every catalogued mistake is caught and named."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from autograder.checks import masking as visible
from autograder.hidden import masking as hidden
from autograder.hidden.masking import MISTAKES
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "03_masking"
SIGNATURES = {
    "to_additive_mask": "(mask, dtype)",
    "causal_mask": "(n, m=None, *, align='top_left', device=None)",
    "padding_mask": "(lengths, max_len)",
    "masked_attention": "(Q, K, V, mask=None)",
}


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    """The signatures the notebook promises (test_catalogue.py holds every catalogued mistake to the reference's)."""
    assert {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES} == SIGNATURES


REQUIRED = {
    "causal_mask": {"a causal mask that excludes the diagonal", "bottom-right alignment ignored",
                    "inverted boolean convention"},
    "padding_mask": {"a padding mask off by one", "inverted boolean convention"},
    "masked_attention": {"inverted boolean convention", "mask applied after softmax", "NaN on rows with no allowed key",
                         "-1e9 instead of -inf", "a float mask treated as boolean"},
    "to_additive_mask": {"-1e9 instead of -inf", "torch.finfo(dtype).min instead of -inf"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


def test_minus_1e9_in_float16(solution):
    """-1e9 is -inf in float16: the to_additive_mask mistake is right there, and only there."""
    mask = torch.tensor([True, False, True])
    half = solution.to_additive_mask(mask, torch.float16)
    assert torch.equal(hidden.to_additive_mask_minus_1e9(mask, torch.float16), half)
    assert hidden.to_additive_mask_minus_1e9(mask, torch.float32)[1].item() == -1e9
    assert solution.to_additive_mask(mask, torch.float16)[1].item() == -math.inf


def test_references_agree_with_pytorch():
    """The visible referees: SDPA's is_causal is top-left, causal_lower_right is bottom-right."""
    for n, m in [(3, 5), (5, 3), (4, 4)]:
        assert torch.equal(visible.sdpa_causal_pattern(n, m), torch.ones(n, m, dtype=torch.bool).tril())
        assert torch.equal(visible.lower_right_pattern(n, m), torch.ones(n, m, dtype=torch.bool).tril(m - n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bias = causal_lower_right(5, 3)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, s, 4, generator=gen, dtype=torch.float64) for s in (5, 3, 3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    ours, _ = visible.masked_attention_reference(q, k, v, visible.lower_right_pattern(5, 3))
    torch.testing.assert_close(ours, expected)


def test_reference_rows_without_keys_are_exact_zeros(solution):
    mask = torch.tensor([[True, False], [False, False]])
    q = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for m in (mask, solution.to_additive_mask(mask, torch.float64)):
        out, weights = solution.masked_attention(q, q[:2], q[:2], m)
        assert torch.equal(out[1], torch.zeros(3, dtype=torch.float64))
        assert torch.equal(weights[1], torch.zeros(2, dtype=torch.float64))
    q.requires_grad_(True)
    out, _ = solution.masked_attention(q, q, q, mask)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def sdpa_inside(Q, K, V, mask=None):
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), None


def sdpa_math_inside(Q, K, V, mask=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), None


def mha_inside(Q, K, V, mask=None):
    mha = torch.nn.MultiheadAttention(Q.shape[-1], 1, batch_first=True, dtype=Q.dtype)
    return mha(Q, K, V, attn_mask=None if mask is None else ~mask)


def mha_forward_inside(Q, K, V, mask=None):
    d = Q.shape[-1]
    weight = torch.eye(d, dtype=Q.dtype).repeat(3, 1)
    out, w = F.multi_head_attention_forward(
        Q.transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1), d, 1, weight, None, None, None, False, 0.0,
        torch.eye(d, dtype=Q.dtype), None, attn_mask=None if mask is None else ~mask,
    )
    return out.transpose(0, 1), w


@pytest.mark.parametrize(
    ("fn", "shown"),
    [
        (sdpa_inside, "torch.nn.functional.scaled_dot_product_attention"),
        (sdpa_math_inside, "torch.nn.functional.scaled_dot_product_attention"),
        (mha_inside, "torch.nn.MultiheadAttention"),
        # guard.py lists nn.MultiheadAttention (alias multi_head_attention_forward) first: that name is shown.
        (mha_forward_inside, "torch.nn.MultiheadAttention"),
    ],
)
@pytest.mark.parametrize("kind", ["visible", "hidden"])
def test_guard_catches_attention_builtins(fn, shown, kind):
    check = (visible if kind == "visible" else hidden).check_masked_attention
    with pytest.raises(CheckFailed) as failure:
        check(fn)
    assert f"masked_attention called {shown}" in str(failure.value)


def test_bad_inputs_raise_value_error(solution):
    with pytest.raises(ValueError, match="align"):
        solution.causal_mask(3, align="center")
    with pytest.raises(ValueError):
        solution.padding_mask(torch.tensor([4, 9]), 5)
    with pytest.raises(ValueError, match=r"\(2, 5\).*\(2, 3, 5\)"):
        solution.masked_attention(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(2, 5, 4),
                                  torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        solution.masked_attention(torch.zeros(3, 4), torch.zeros(5, 6), torch.zeros(5, 4))
    with pytest.raises(ValueError):
        solution.to_additive_mask(torch.zeros(2, 3), torch.float32)


def mask_filled_on_the_default_device(lengths, max_len):
    if lengths.dim() != 1 or bool((lengths < 0).any()) or bool((lengths > max_len).any()):
        raise ValueError("lengths do not fit")
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)  # on the default device
    for b, length in enumerate(lengths.tolist()):
        mask[b, :length] = True
    return mask


def mask_of_lengths_copied_by_as_tensor(lengths, max_len):
    lengths = torch.as_tensor(lengths)  # copies lengths to the default device
    if lengths.dim() != 1 or bool((lengths < 0).any()) or bool((lengths > max_len).any()):
        raise ValueError("lengths do not fit")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


def mask_moved_to_the_device_of_lengths(lengths, max_len):
    if lengths.dim() != 1 or bool((lengths < 0).any()) or bool((lengths > max_len).any()):
        raise ValueError("lengths do not fit")
    return (torch.arange(max_len) < lengths.to(torch.get_default_device())[:, None]).to(lengths.device)


@pytest.mark.parametrize("fn", [mask_filled_on_the_default_device, mask_of_lengths_copied_by_as_tensor])
def test_a_mask_made_on_the_default_device_fails(fn):
    """Right while the default device is the CPU, as in every other case; wrong once a program moves it."""
    assert torch.equal(fn(torch.tensor([2, 0, 3]), 4), visible.padding_reference(torch.tensor([2, 0, 3]), 4))
    for check in (visible.check_padding_mask, hidden.check_padding_mask):
        with pytest.raises(CheckFailed, match="default device"):
            check(fn)


def test_a_mask_moved_to_the_device_of_lengths_passes(capsys):
    """Built on the default device and moved to that of lengths: right wherever the default device holds data."""
    visible.check_padding_mask(mask_moved_to_the_device_of_lengths)
    hidden.check_padding_mask(mask_moved_to_the_device_of_lengths)
    assert "padding_mask passes the hidden checks" in capsys.readouterr().out
