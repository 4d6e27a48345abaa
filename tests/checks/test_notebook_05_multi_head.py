"""Notebook 05: the reference passes every check, every catalogued mistake is caught and named."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks import multi_head as visible
from autograder.hidden import multi_head as hidden
from autograder.hidden.multi_head import MISTAKES
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "05_multi_head"
EXERCISES = ["split_heads", "merge_heads", "MultiHeadAttention", "grouped_query_attention", "graph_attention"]
SIGNATURES = {
    "split_heads": "(x, num_heads)",
    "merge_heads": "(x)",
    "MultiHeadAttention": "(d_model, num_heads, bias=True)",
    "grouped_query_attention": "(Q, K, V, mask=None)",
    "graph_attention": "(X, edges, W_Q, W_K, W_V, self_loops=True)",
}
METHOD_SIGNATURES = {
    "from_torch": "(mha)",
    "forward": "(self, query, key, value, attn_mask=None, key_padding_mask=None)",
}


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    """The signatures the notebook promises (test_catalogue.py holds every catalogued mistake to the reference's)."""
    assert {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES} == SIGNATURES
    for method, signature in METHOD_SIGNATURES.items():
        assert str(inspect.signature(getattr(solution.MultiHeadAttention, method))) == signature, method


REQUIRED = {
    "split_heads": {"a plain view to (B, h, T, d) without the transpose"},
    "merge_heads": {"a plain view back to (B, T, D) without the transpose"},
    "MultiHeadAttention": {"a missing output projection", "scaling by sqrt(d_model) instead of sqrt(d_head)",
                           "masks in nn.MultiheadAttention's convention (True = masked)"},
    "grouped_query_attention": {"repeat instead of repeat_interleave"},
    "graph_attention": {"adjacency transposed: messages flow the wrong way", "softmax over all nodes instead of the neighbours",
                        "self-loops forgotten (zero rows for isolated nodes)",
                        "self-loops forgotten (NaN rows for isolated nodes)", "duplicate edges counted twice"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


# --- the referees -----------------------------------------------------------------------------


def test_torch_reference_inverts_the_masks():
    """The referee gives nn.MultiheadAttention its own convention (True = masked)."""
    torch_mha = visible.TorchMHA(8, 2, seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, generator=gen, dtype=torch.float64)
    real = torch.tensor([[True, True, False, False]])
    _, weights = visible.torch_mha_reference(torch_mha, x, x, x, key_padding_mask=real)
    assert weights.shape == (1, 2, 4, 4)
    assert torch.equal(weights[..., 2:], torch.zeros(1, 2, 4, 2, dtype=torch.float64))
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    _, weights = visible.torch_mha_reference(torch_mha, x, x, x, attn_mask=causal)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))


def test_loop_reference_agrees_with_torch():
    torch_mha = visible.TorchMHA(12, 3, seed=4)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 12, generator=gen, dtype=torch.float64), torch.randn(2, 5, 12, generator=gen,
                                                                                  dtype=torch.float64)
    masks = {"attn_mask": torch.rand(3, 5, generator=gen) < 0.7,
             "key_padding_mask": torch.tensor([[1] * 5, [1] * 4 + [0]]).bool()}
    masks["attn_mask"][:, 0] = True
    for expected, got in zip(visible.torch_mha_reference(torch_mha, q, k, k, **masks),
                             hidden._loop_reference(torch_mha, q, k, k, **masks), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_gqa_reference_groups_consecutive_heads():
    gen = torch.Generator().manual_seed(2)
    Q = torch.randn(1, 6, 3, 4, generator=gen, dtype=torch.float64)
    K, V = (torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    out, weights = visible.gqa_reference(Q, K, V)
    K3, V3 = K.repeat_interleave(3, dim=1), V.repeat_interleave(3, dim=1)
    expected = torch.softmax(Q @ K3.mT / 2.0, dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ V3)


def test_reference_gqa_rows_without_keys_are_exact_zeros(solution):
    gen = torch.Generator().manual_seed(3)
    Q = torch.randn(1, 4, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    K, V = (torch.randn(1, 2, 3, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out, weights = solution.grouped_query_attention(Q, K, V, mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 4, 3, dtype=torch.float64))
    assert torch.equal(weights[:, :, 1], torch.zeros(1, 4, 3, dtype=torch.float64))
    out.sum().backward()
    assert torch.isfinite(Q.grad).all()


def test_split_and_merge_are_exact_inverses(solution):
    gen = torch.Generator().manual_seed(4)
    for B, T, D, h in [(2, 5, 12, 3), (1, 1, 7, 7), (3, 4, 6, 1)]:
        x = torch.randn(B, T, D, generator=gen)
        assert torch.equal(solution.merge_heads(solution.split_heads(x, h)), x)
        heads = torch.randn(B, h, T, D // h, generator=gen)
        assert torch.equal(solution.split_heads(solution.merge_heads(heads), h), heads)


def test_from_torch_keeps_dtype_and_bias(solution):
    for bias in (True, False):
        torch_mha = visible.TorchMHA(8, 4, bias=bias, seed=5)
        module = solution.MultiHeadAttention.from_torch(torch_mha.mha)
        assert all(p.dtype == torch.float64 for p in module.parameters())
        assert sum(p.numel() for p in module.parameters()) == 4 * 64 + (4 * 8 if bias else 0)


# --- unwritten exercises and the guard ----------------------------------------------------------


def not_written(*args, **kwargs):
    raise NotImplementedError()


class NotWritten(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        raise NotImplementedError()

    @classmethod
    def from_torch(cls, mha):
        raise NotImplementedError()

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        raise NotImplementedError()


@pytest.mark.parametrize("exercise", EXERCISES)
@pytest.mark.parametrize("kind", ["visible", "hidden"])
def test_unwritten_exercise_says_so(exercise, kind):
    check = getattr(visible if kind == "visible" else hidden, f"check_{exercise}")
    with pytest.raises(CheckFailed) as failure:
        check(NotWritten if exercise == "MultiHeadAttention" else not_written)
    assert f"{exercise} is not written yet" in str(failure.value)


def gqa_sdpa_inside(Q, K, V, mask=None):
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True), None


def gqa_mha_forward_inside(Q, K, V, mask=None):
    d = Q.shape[-1]
    weight = torch.eye(d, dtype=Q.dtype).repeat(3, 1)
    q = Q.flatten(0, 1).transpose(0, 1)
    kv = K.repeat_interleave(Q.shape[1] // K.shape[1], dim=1).flatten(0, 1).transpose(0, 1)
    out, w = F.multi_head_attention_forward(q, kv, kv, d, 1, weight, None, None, None, False, 0.0,
                                            torch.eye(d, dtype=Q.dtype), None)
    return out.transpose(0, 1).reshape(Q.shape), w


class MHAWrappingTorch(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.mha = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True)

    @classmethod
    def from_torch(cls, mha):
        module = cls(mha.embed_dim, mha.num_heads)
        module.mha = mha
        return module

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        return self.mha(query, key, value, attn_mask=None if attn_mask is None else ~attn_mask,
                        key_padding_mask=None if key_padding_mask is None else ~key_padding_mask,
                        average_attn_weights=False)


class MHAWithSDPA(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.inner = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_torch(cls, mha):
        module = cls(mha.embed_dim, mha.num_heads).to(mha.in_proj_weight.dtype)
        with torch.no_grad():
            module.inner.weight.copy_(mha.in_proj_weight)
            module.inner.bias.copy_(mha.in_proj_bias)
            module.out.weight.copy_(mha.out_proj.weight)
            module.out.bias.copy_(mha.out_proj.bias)
        return module

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        B, n, D = query.shape
        q, k, v = (t.view(B, -1, self.num_heads, D // self.num_heads).transpose(1, 2)
                   for t in self.inner(query).chunk(3, -1))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out(out.transpose(1, 2).reshape(B, n, D)), None


def graph_sdpa_inside(X, edges, W_Q, W_K, W_V, self_loops=True):
    mask = torch.zeros(X.shape[0], X.shape[0], dtype=torch.bool)
    mask[edges[1], edges[0]] = True
    if self_loops:
        mask |= torch.eye(X.shape[0], dtype=torch.bool)
    eye = torch.eye(X.shape[0], dtype=X.dtype)
    return (F.scaled_dot_product_attention(X @ W_Q, X @ W_K, X @ W_V, attn_mask=mask),
            F.scaled_dot_product_attention(X @ W_Q, X @ W_K, eye, attn_mask=mask))


@pytest.mark.parametrize(
    ("exercise", "fn", "shown"),
    [
        ("grouped_query_attention", gqa_sdpa_inside, "torch.nn.functional.scaled_dot_product_attention"),
        # guard.py lists nn.MultiheadAttention (alias multi_head_attention_forward) first: that name is shown.
        ("grouped_query_attention", gqa_mha_forward_inside, "torch.nn.MultiheadAttention"),
        ("MultiHeadAttention", MHAWrappingTorch, "torch.nn.MultiheadAttention"),
        ("MultiHeadAttention", MHAWithSDPA, "torch.nn.functional.scaled_dot_product_attention"),
        ("graph_attention", graph_sdpa_inside, "torch.nn.functional.scaled_dot_product_attention"),
    ],
)
@pytest.mark.parametrize("kind", ["visible", "hidden"])
def test_guard_catches_attention_builtins(exercise, fn, shown, kind):
    check = getattr(visible if kind == "visible" else hidden, f"check_{exercise}")
    with pytest.raises(CheckFailed) as failure:
        check(fn)
    assert f"{exercise} called {shown}" in str(failure.value), str(failure.value)


def test_bad_inputs_raise_value_error(solution):
    with pytest.raises(ValueError, match=r"\(2, 3, 10\)"):
        solution.split_heads(torch.zeros(2, 3, 10), 4)
    with pytest.raises(ValueError, match=r"\(3, 10\)"):
        solution.split_heads(torch.zeros(3, 10), 2)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        solution.merge_heads(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError):
        solution.MultiHeadAttention(10, 3)
    module = solution.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(2, 3, 8\).*\(2, 4, 6\)"):
        module(torch.zeros(2, 3, 8), torch.zeros(2, 4, 6), torch.zeros(2, 4, 6))
    with pytest.raises(ValueError, match=r"\(6, 2, 4\).*\(4, 3, 4\)|\(1, 6, 2, 4\).*\(1, 4, 3, 4\)"):
        solution.grouped_query_attention(torch.zeros(1, 6, 2, 4), torch.zeros(1, 4, 3, 4), torch.zeros(1, 4, 3, 4))
    X, W = torch.zeros(4, 3), torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"\(2, E\)"):
        solution.graph_attention(X, torch.tensor([0, 1, 2]), W, W, W)
    with pytest.raises(ValueError, match=r"0 \.\.\. 3"):
        solution.graph_attention(X, torch.tensor([[0, 4], [1, 2]]), W, W, W)
    with pytest.raises(ValueError, match=r"0 \.\.\. 3"):
        solution.graph_attention(X, torch.tensor([[0, -1], [1, 2]]), W, W, W)
    with pytest.raises(ValueError, match="integer"):
        solution.graph_attention(X, torch.tensor([[0.0, 1.0], [1.0, 2.0]]), W, W, W)
    with pytest.raises(ValueError, match=r"\(3, 5\)"):
        solution.graph_attention(X, torch.tensor([[0], [1]]), W, torch.zeros(3, 5), W)


# --- attention on a graph: the referee and its inputs ------------------------------------------


def neighbour_softmax(X, edges, W_Q, W_K, W_V, self_loops=True):
    """Graph attention node by node, from the definition: a softmax over the set of in-neighbours of each node."""
    N = X.shape[0]
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    weights = torch.zeros(N, N, dtype=X.dtype)
    for i in range(N):
        sources = {j for j, t in edges.T.tolist() if t == i} | ({i} if self_loops else set())
        if sources:
            js = sorted(sources)
            weights[i, js] = torch.softmax(torch.stack([Q[i] @ K[j] for j in js]) / math.sqrt(Q.shape[-1]), dim=0)
    return weights @ V, weights


@pytest.mark.parametrize("self_loops", [True, False])
def test_graph_reference_is_a_softmax_over_each_nodes_in_neighbours(self_loops):
    gen = torch.Generator().manual_seed(5)
    for N, E in [(1, 0), (4, 0), (6, 9), (9, 25)]:
        edges = visible.random_graph(N, E, gen, no_in_edge=(0,) if N > 1 else (), loops=(N - 1,), duplicates=min(E, 3))
        X = torch.randn(N, 5, generator=gen, dtype=torch.float64)
        W_Q, W_K, W_V = (torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
        for got, expected in zip(visible.graph_attention_reference(X, edges, W_Q, W_K, W_V, self_loops),
                                 neighbour_softmax(X, edges, W_Q, W_K, W_V, self_loops), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_graph_adjacency_rows_are_targets():
    edges = torch.tensor([[0, 0, 2], [1, 1, 2]])  # 0 -> 1 twice, a loop at 2
    mask = visible.graph_adjacency(edges, 3, self_loops=False)
    assert mask.tolist() == [[False, False, False], [True, False, False], [False, False, True]]
    assert torch.equal(visible.graph_adjacency(edges, 3), mask | torch.eye(3, dtype=torch.bool))


def test_random_graph_has_what_it_promises():
    gen = torch.Generator().manual_seed(6)
    edges = visible.random_graph(8, 14, gen, no_in_edge=(2,), isolated=(6,), loops=(4,), duplicates=3)
    assert edges.shape == (2, 14 + 1 + 3) and edges.dtype == torch.long
    assert 2 not in edges[1].tolist() and 6 not in edges.flatten().tolist()
    assert [4, 4] in edges.T.tolist()
    assert len({tuple(e) for e in edges.T.tolist()}) <= edges.shape[1] - 3  # the 3 duplicates
    assert visible.random_graph(3, 0, gen).shape == (2, 0)

