"""Visible checks for notebook 05, multi-head attention."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import fail
from ..guard import ATTENTION_BUILTINS
from ..inputs import generator, math_sdpa, randn
from ..student import call_student, expect_error
from ..verify import Case, verify

INF = float("inf")


# --- referees built from PyTorch --------------------------------------------------------


def split_reference(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Head i gets features i*d ... (i+1)*d - 1 of every token: chunks of the last axis, stacked."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def merge_reference(x: torch.Tensor) -> torch.Tensor:
    """The heads laid side by side again: the per-head slices concatenated along features."""
    return torch.cat(x.unbind(dim=1), dim=-1)


class TorchMHA:
    """An ``nn.MultiheadAttention`` (batch_first=True) with random weights from a seeded generator.

    Its ``repr`` is one line, so a failing check can say which module it used.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, dtype=torch.float64, seed: int = 0):
        with torch.random.fork_rng(devices=[]):  # leave the global random state alone
            self.mha = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=dtype).eval()
        gen = generator(seed)
        with torch.no_grad():
            for p in self.mha.parameters():
                p.copy_(randn(*p.shape, gen=gen, dtype=dtype) / d_model**0.5)
        self.d_model, self.num_heads, self.bias, self.dtype = d_model, num_heads, bias, dtype

    def __repr__(self) -> str:
        return (
            f"nn.MultiheadAttention({self.d_model}, {self.num_heads}, bias={self.bias}, batch_first=True, "
            f"dtype={self.dtype})"
        )


def run_module(module_class):
    """``module_class.from_torch(mha)`` called on the inputs: how a check runs a MultiHeadAttention class."""

    def run(torch_mha, query, key, value, **masks):
        module = module_class.from_torch(torch_mha.mha)
        return module(query, key, value, **masks)

    return run


def torch_mha_reference(torch_mha, query, key, value, attn_mask=None, key_padding_mask=None):
    """``nn.MultiheadAttention`` itself, per-head weights, its masks converted to its convention.

    Its boolean masks mean True = masked, the opposite of this course, so they are inverted;
    a float ``attn_mask`` is added to the scores by both.
    """
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask
    if key_padding_mask is not None:
        key_padding_mask = ~key_padding_mask
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            # nn.MultiheadAttention wants both masks of one kind: make the padding mask additive too.
            key_padding_mask = torch.zeros(key_padding_mask.shape, dtype=attn_mask.dtype).masked_fill(
                key_padding_mask, -INF
            )
    with torch.no_grad():
        return torch_mha.mha(
            query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
            need_weights=True, average_attn_weights=False,
        )


def gqa_reference(Q, K, V, mask=None):
    """SDPA with ``enable_gqa=True`` (math backend); the weights are SDPA applied to the identity.

    A query with no allowed key gets zero weights and zero output (SDPA's math backend does this).
    """
    m = K.shape[-2]
    eye = torch.eye(m, dtype=K.dtype).expand(*K.shape[:-2], m, m)
    return (
        math_sdpa(Q, K, V, attn_mask=mask, enable_gqa=True),
        math_sdpa(Q, K, eye, attn_mask=mask, enable_gqa=True),
    )


def count_parameters(module) -> int:
    """How many numbers the module's registered parameters hold."""
    return sum(p.numel() for p in module.parameters())


def check_parameters(MultiHeadAttention, d_model: int, num_heads: int, bias: bool) -> None:
    """The module is an nn.Module whose registered parameters are W_Q, W_K, W_V, W_O (and biases)."""
    what = f"MultiHeadAttention({d_model}, {num_heads}, bias={bias})"
    module = call_student(MultiHeadAttention, d_model, num_heads, bias=bias, what=what)
    if not isinstance(module, nn.Module):
        fail(f"{what} should be an nn.Module (class MultiHeadAttention(nn.Module)), but it is a "
             f"{type(module).__name__}.")
    expected = 4 * d_model * d_model + (4 * d_model if bias else 0)
    got = count_parameters(module)
    if got != expected:
        fail(
            f"{what} has {got} parameters, but it should have {expected}: four d_model x d_model matrices "
            f"(W_Q, W_K, W_V and the output projection W_O)" + (" and their four biases of d_model" if bias else "")
            + ". Register them as attributes that are nn.Linear modules or nn.Parameter tensors "
            "(plain tensors are not parameters: an optimiser would never train them)."
        )


# --- the checks -----------------------------------------------------------------------------


def check_split_heads(split_heads) -> None:
    """Head i, token t holds features i*d ... (i+1)*d - 1 of token t; D not divisible by h raises."""
    gen = generator(0)
    cases = [
        Case((randn(2, 3, 8, gen=gen), 2), label="2 heads of 4 features"),
        Case((randn(1, 4, 6, gen=gen), 3), label="3 heads of 2 features"),
        Case((randn(2, 6, 5, gen=gen).transpose(1, 2), 3), label="a non-contiguous x (a transposed tensor)"),
    ]
    verify(split_heads, cases, split_reference, exercise="split_heads", arg_names=("x", "num_heads"),
           outputs=None, rtol=0, atol=0)
    expect_error(split_heads, randn(2, 3, 10, gen=gen), 3, error=ValueError,
                 what="split_heads(x (2, 3, 10), num_heads=3)", why="10 features cannot be split into 3 equal heads")
    print("split_heads passes the visible checks.")


def check_merge_heads(merge_heads) -> None:
    """(B, h, T, d) -> (B, T, h*d), the heads side by side; it undoes a split exactly."""
    gen = generator(1)
    cases = [
        Case((randn(2, 2, 3, 4, gen=gen),), label="2 heads of 4 features"),
        Case((randn(1, 3, 4, 2, gen=gen),), label="3 heads of 2 features"),
    ]
    verify(merge_heads, cases, merge_reference, exercise="merge_heads", arg_names=("x",), outputs=None,
           rtol=0, atol=0)
    x = randn(2, 5, 12, gen=gen)
    merged = call_student(merge_heads, split_reference(x, 3), what="merge_heads(split of x (2, 5, 12) into 3 heads)")
    if not isinstance(merged, torch.Tensor) or merged.shape != x.shape or not torch.equal(merged, x):
        fail("merge_heads should undo the split exactly: merging x (2, 5, 12) split into 3 heads does not give x back.")
    print("merge_heads passes the visible checks.")


def check_MultiHeadAttention(MultiHeadAttention) -> None:  # noqa: N802 - named after the class it checks
    """Against nn.MultiheadAttention with the same weights (float64): self- and cross-attention, masks."""
    gen = generator(2)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    x, y = randn(2, 5, 8, gen=gen), randn(1, 5, 8, gen=gen)
    cases = [
        Case((TorchMHA(8, 2, seed=1), x, x, x), label="self-attention, no mask"),
        Case((TorchMHA(12, 3, bias=False, seed=2), randn(2, 3, 12, gen=gen), randn(2, 6, 12, gen=gen),
              randn(2, 6, 12, gen=gen)), {"key_padding_mask": padding},
             label="cross-attention, n != m, no bias, padding mask: True = real token"),
        Case((TorchMHA(8, 4, seed=3), y, y, y), {"attn_mask": causal},
             label="self-attention, causal mask: True = may attend"),
    ]
    verify(run_module(MultiHeadAttention), cases, torch_mha_reference, exercise="MultiHeadAttention",
           arg_names=("mha", "query", "key", "value"), forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-10)
    check_parameters(MultiHeadAttention, 8, 2, True)
    expect_error(MultiHeadAttention, 10, 4, error=ValueError, what="MultiHeadAttention(10, 4)",
                 why="d_model = 10 cannot be split into 4 equal heads")
    print("MultiHeadAttention passes the visible checks.")


def check_grouped_query_attention(grouped_query_attention) -> None:
    """Against F.scaled_dot_product_attention(..., enable_gqa=True) in float64."""
    gen = generator(3)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    blocked = torch.ones(3, 5, dtype=torch.bool)
    blocked[1] = False
    cases = [
        Case((randn(2, 4, 3, 5, gen=gen), randn(2, 2, 6, 5, gen=gen), randn(2, 2, 6, 5, gen=gen)),
             label="4 query heads share 2 key/value heads"),
        Case((randn(1, 3, 4, 2, gen=gen), randn(1, 1, 4, 2, gen=gen), randn(1, 1, 4, 2, gen=gen)),
             {"mask": causal}, label="multi-query attention (g = 1), causal mask"),
        Case((randn(1, 2, 3, 4, gen=gen), randn(1, 2, 5, 4, gen=gen), randn(1, 2, 5, 4, gen=gen)),
             {"mask": blocked}, label="query 2 may attend to no key: its weights and output are zero"),
    ]
    verify(grouped_query_attention, cases, gqa_reference, exercise="grouped_query_attention",
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-12)
    expect_error(grouped_query_attention, randn(1, 6, 2, 4, gen=gen), randn(1, 4, 3, 4, gen=gen),
                 randn(1, 4, 3, 4, gen=gen), error=ValueError,
                 what="grouped_query_attention(Q (1, 6, 2, 4), K (1, 4, 3, 4), V (1, 4, 3, 4))",
                 why="6 query heads cannot be shared equally among 4 key/value heads")
    print("grouped_query_attention passes the visible checks.")
